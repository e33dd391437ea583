//! Micro-benchmarks of the built-in codecs (`appsrv::codec`), through their public API.
//!
//! ```text
//! cargo bench -p appsrv-benches --bench codecs
//! cargo bench -p appsrv-benches --bench codecs -- http          # only the HTTP benchmarks
//! cargo bench -p appsrv-benches --bench codecs -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! What it measures, per codec (`lines`, `length`, `netstring`, `http`), on one typical
//! request and its response, in memory (no socket, no system call):
//!
//! - `decode`: [`Codec::decode`] of one complete request at the front of the read buffer,
//!   as the connection loop calls it for each request (the buffer is not copied between
//!   iterations: these codecs do not modify it, HTTP only to de-chunk a chunked body);
//! - `encode`: [`Codec::respond`], the handler's writes of a typical response body, and
//!   [`Respond::finish`] (the length prefix, the netstring's length, the HTTP head with its
//!   `Date`), appended to an output buffer that is cleared after each response, as the
//!   loop does once the batch is written;
//! - `decode+encode`: both, the codec's whole share of one request;
//! - `decode_pipelined/16`: 16 requests in one buffer, decoded one after another (the
//!   pipelining case: one `read` delivers them all);
//! - `http/httparse_only`: the floor under the HTTP codec's `decode`: [`httparse`] (the
//!   parser the codec is built on, a dependency of appsrv) alone on the same heads, with
//!   the codec's array of 64 headers.
//!
//! The HTTP requests are the head `wrk` sends (`GET /`, `Host` only, 40 bytes) and a
//! browser-like head (`GET` with a query and 9 headers, 438 bytes); the response is
//! what the `http_hello` example sends: `200`, `Content-Type: text/plain`, 13 bytes.
//!
//! Throughput is reported in bytes of request (decode) or response (encode) per second.
//! Without the plotting features, Criterion prints its figures and keeps its history in
//! `target/criterion/`, where a second run is compared with the first.

use std::hint::black_box;
use std::io::Write;

use appsrv::codec::{
    Codec, Decoded, Http, HttpResponse, LengthPrefixed, LengthResponse, Lines, LinesResponse, Netstring,
    NetstringResponse, Prefix, Respond,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// A key-value `GET` line, as the `kv` example serves.
const LINE_REQUEST: &[u8] = b"GET session:4f2a9c81d07e\r\n";
/// Its answer.
const LINE_RESPONSE: &[u8] = b"VALUE user=1042;role=editor;exp=1767225600\r\n";

/// A 43-byte binary payload (a small RPC call), in a frame or a netstring.
const PAYLOAD: &[u8] = b"\x01\x00\x2acall:user.get\x00id=1042\x00fields=name,role\x00\x00";
/// An 86-byte answer payload.
const ANSWER: &[u8] = b"\x02\x00\x2aok\x00name=Ada Lovelace\x00role=editor\x00since=2019-04-01\x00\
                        quota=1048576\x00flags=0x0000002a\x00\x00\x00";

/// The request `wrk` sends by default.
const HTTP_WRK: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n";
/// A browser-like request head.
const HTTP_BROWSER: &[u8] = b"GET /api/v1/items?page=2&sort=name HTTP/1.1\r\n\
Host: app.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: application/json, text/plain, */*\r\n\
Accept-Language: en-GB,en;q=0.7,fr;q=0.3\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Referer: https://app.example.com/items\r\n\
Cookie: session=4f2a9c81d07e4b1f9a3e2c5d6b7a8f90; theme=dark; lang=en\r\n\
Connection: keep-alive\r\n\
Sec-Fetch-Mode: cors\r\n\
\r\n";
/// The body of the `http_hello` example.
const HELLO: &[u8] = b"Hello, World!";

/// The bytes a frame of `payload` takes on the wire, with a 4-byte prefix.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(payload.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// `payload` as a netstring.
fn netstring(payload: &[u8]) -> Vec<u8> {
    let mut v = format!("{}:", payload.len()).into_bytes();
    v.extend_from_slice(payload);
    v.push(b',');
    v
}

/// Decodes the request at the front of `buf`, which must be complete; returns its length.
fn decode_len<C: Codec>(codec: &mut C, buf: &mut [u8]) -> usize {
    match codec.decode(black_box(buf)) {
        Ok(Decoded::Request { request, len }) => {
            black_box(&request);
            len
        }
        Ok(_) => panic!("incomplete request"),
        Err(e) => panic!("bad request: {e}"),
    }
}

/// Decodes the `n` requests of `buf` one after another, as the loop does for a pipelined
/// batch.
fn decode_all<C: Codec>(codec: &mut C, buf: &mut [u8], n: usize) {
    let mut at = 0;
    for _ in 0..n {
        at += decode_len(codec, &mut buf[at..]);
    }
    assert_eq!(at, buf.len());
}

/// The responses' output buffer, as large as the connection's (it keeps its capacity).
fn output() -> Vec<u8> {
    Vec::with_capacity(16 * 1024)
}

/// One response to `request`: `respond`, the handler's writes (`body`), `finish`; then the
/// output buffer is cleared, as the loop does once the batch is written.
fn answer<C: Codec>(
    codec: &mut C,
    request: &C::Request<'_>,
    out: &mut Vec<u8>,
    body: &impl for<'r> Fn(&mut C::Response<'r>),
) {
    let mut res = codec.respond(request, out, false);
    body(&mut res);
    black_box(res.finish());
    out.clear();
}

/// The codec's whole share of one request: decode the one at the front of `buf`, answer it.
fn decode_and_answer<C: Codec>(
    codec: &mut C,
    buf: &mut [u8],
    out: &mut Vec<u8>,
    body: &impl for<'r> Fn(&mut C::Response<'r>),
) {
    let Ok(Decoded::Request { request, .. }) = codec.decode(black_box(buf)) else {
        unreachable!()
    };
    answer(codec, &request, out, body);
}

fn lines(c: &mut Criterion) {
    let mut g = c.benchmark_group("lines");
    let mut codec = Lines::default();
    let mut buf = LINE_REQUEST.to_vec();
    let mut out = output();

    g.throughput(Throughput::Bytes(LINE_REQUEST.len() as u64));
    g.bench_function("decode", |b| b.iter(|| decode_len(&mut codec, &mut buf)));
    g.throughput(Throughput::Bytes(LINE_RESPONSE.len() as u64));
    let body = |res: &mut LinesResponse<'_>| res.push(black_box(LINE_RESPONSE));
    g.bench_function("encode", |b| {
        let req = appsrv::codec::Line::new(b"GET session:4f2a9c81d07e");
        b.iter(|| answer(&mut codec, &req, &mut out, &body))
    });
    g.throughput(Throughput::Bytes(LINE_REQUEST.len() as u64));
    g.bench_function("decode+encode", |b| {
        b.iter(|| decode_and_answer(&mut codec, &mut buf, &mut out, &body))
    });
    let mut batch = LINE_REQUEST.repeat(16);
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("decode_pipelined/16", |b| {
        b.iter(|| decode_all(&mut codec, &mut batch, 16))
    });
    g.finish();
}

fn length(c: &mut Criterion) {
    let mut g = c.benchmark_group("length");
    let mut codec = LengthPrefixed::new(Prefix::U32);
    let write_answer = |res: &mut LengthResponse<'_>| res.write_all(black_box(ANSWER)).unwrap();
    let mut buf = frame(PAYLOAD);
    let mut out = output();
    let wire_answer = (ANSWER.len() + 4) as u64;

    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("decode", |b| b.iter(|| decode_len(&mut codec, &mut buf)));
    g.throughput(Throughput::Bytes(wire_answer));
    g.bench_function("encode", |b| {
        b.iter(|| answer(&mut codec, &PAYLOAD, &mut out, &write_answer))
    });
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("decode+encode", |b| {
        b.iter(|| decode_and_answer(&mut codec, &mut buf, &mut out, &write_answer))
    });
    let mut batch = buf.repeat(16);
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("decode_pipelined/16", |b| {
        b.iter(|| decode_all(&mut codec, &mut batch, 16))
    });
    g.finish();
}

fn netstrings(c: &mut Criterion) {
    let mut g = c.benchmark_group("netstring");
    let mut codec = Netstring::default();
    let write_answer = |res: &mut NetstringResponse<'_>| res.write_all(black_box(ANSWER)).unwrap();
    let mut buf = netstring(PAYLOAD);
    let mut out = output();
    let wire_answer = netstring(ANSWER).len() as u64;

    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("decode", |b| b.iter(|| decode_len(&mut codec, &mut buf)));
    g.throughput(Throughput::Bytes(wire_answer));
    // Every response has the same length, so from the second on the codec's guess of the
    // length's width is right and the payload is not moved (the common case).
    g.bench_function("encode", |b| {
        b.iter(|| answer(&mut codec, &PAYLOAD, &mut out, &write_answer))
    });
    // Responses of 1 and 2 digits in turn: the guess is always wrong, the payload moves.
    g.throughput(Throughput::Bytes(
        netstring(&ANSWER[..9]).len() as u64 + wire_answer,
    ));
    g.bench_function("encode_width_changes", |b| {
        b.iter(|| {
            for answer in [&ANSWER[..9], ANSWER] {
                let mut res = codec.respond(&PAYLOAD, &mut out, false);
                res.write_all(black_box(answer)).unwrap();
                black_box(res.finish());
                out.clear();
            }
        })
    });
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("decode+encode", |b| {
        b.iter(|| decode_and_answer(&mut codec, &mut buf, &mut out, &write_answer))
    });
    let mut batch = buf.repeat(16);
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("decode_pipelined/16", |b| {
        b.iter(|| decode_all(&mut codec, &mut batch, 16))
    });
    g.finish();
}

fn http(c: &mut Criterion) {
    let mut g = c.benchmark_group("http");
    let mut codec = Http::new();
    let mut out = output();
    // http_hello's handler.
    let hello = |res: &mut HttpResponse<'_>| {
        res.content_type("text/plain");
        res.write_all(black_box(HELLO)).unwrap();
    };

    for (name, head) in [("wrk", HTTP_WRK), ("browser", HTTP_BROWSER)] {
        let mut buf = head.to_vec();
        g.throughput(Throughput::Bytes(head.len() as u64));
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| decode_len(&mut codec, &mut buf))
        });
    }

    // The floor under `decode`: httparse alone on the same heads, with the codec's array
    // of 64 headers, locating the parts and nothing else.
    for (name, head) in [("wrk", HTTP_WRK), ("browser", HTTP_BROWSER)] {
        g.throughput(Throughput::Bytes(head.len() as u64));
        g.bench_function(format!("httparse_only/{name}"), |b| {
            b.iter(|| {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut headers);
                let status = req.parse(black_box(head)).unwrap();
                assert!(status.is_complete());
                black_box((req.method, req.path, req.headers.len()));
            })
        });
    }

    // The response of the http_hello example, to the request wrk sends.
    let mut req_buf = HTTP_WRK.to_vec();
    let mut sample = Vec::new();
    {
        let Ok(Decoded::Request { request, .. }) = codec.decode(&mut req_buf) else {
            unreachable!()
        };
        let mut res = codec.respond(&request, &mut sample, false);
        res.content_type("text/plain");
        res.write_all(HELLO).unwrap();
        res.finish();
    }
    g.throughput(Throughput::Bytes(sample.len() as u64));
    g.bench_function("encode/hello", |b| {
        let mut buf = HTTP_WRK.to_vec();
        let Ok(Decoded::Request { request, .. }) = Http::new().decode(&mut buf) else {
            unreachable!()
        };
        b.iter(|| answer(&mut codec, black_box(&request), &mut out, &hello))
    });

    for (name, head) in [("wrk", HTTP_WRK), ("browser", HTTP_BROWSER)] {
        let mut buf = head.to_vec();
        g.throughput(Throughput::Bytes(head.len() as u64));
        g.bench_function(format!("decode+encode/{name}"), |b| {
            b.iter(|| decode_and_answer(&mut codec, &mut buf, &mut out, &hello))
        });
    }

    let mut batch = HTTP_WRK.repeat(16);
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("decode_pipelined/16", |b| {
        b.iter(|| decode_all(&mut codec, &mut batch, 16))
    });
    g.finish();
}

criterion_group!(benches, lines, length, netstrings, http);
criterion_main!(benches);

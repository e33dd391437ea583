//! The HTTP codec's tests, through its [`Codec`] interface: requests split at every
//! byte, chunked bodies, line ends, `100 Continue`, keep-alive, responses and error
//! replies, limits.

use std::fs::File;

use super::super::testing::decode_all;
use super::decode::{NO_HOST, SEVERAL_HOSTS, has_bare_lf};
use super::*;
use crate::codec::{Outcome, Respond};
use proptest::prelude::*;

/// The parts of a request, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts {
    method: String,
    target: String,
    version: u8,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    keep_alive: bool,
}

fn parts(r: &HttpRequest<'_>) -> Parts {
    Parts {
        method: r.method().to_owned(),
        target: r.target().to_owned(),
        version: r.version(),
        headers: r.headers().map(|(n, v)| (n.to_owned(), v.to_vec())).collect(),
        body: r.body().to_vec(),
        keep_alive: r.keep_alive(),
    }
}

fn decode(input: &[u8], chunk: usize) -> Result<Vec<Parts>, ProtocolError> {
    decode_all(&mut Http::new(), input, chunk, parts)
}

fn decode_one(input: &[u8]) -> Result<Parts, ProtocolError> {
    let mut all = decode(input, input.len())?;
    assert_eq!(
        all.len(),
        1,
        "one request in {:?}",
        String::from_utf8_lossy(input)
    );
    Ok(all.remove(0))
}

/// Decodes a single complete request and makes the response to it with `handle`.
fn respond_to(
    input: &[u8],
    last: bool,
    handle: impl FnOnce(&HttpRequest<'_>, &mut HttpResponse<'_>),
) -> (String, Outcome) {
    let mut codec = Http::new();
    let mut buf = input.to_vec();
    let mut out = Vec::new();
    let Decoded::Request { request, len } = codec.decode(&mut buf).unwrap() else {
        panic!("incomplete request");
    };
    assert_eq!(len, input.len());
    let mut res = codec.respond(&request, &mut out, last);
    handle(&request, &mut res);
    let outcome = res.finish();
    (String::from_utf8(out).unwrap(), outcome)
}

fn error_reply(err: &ProtocolError) -> String {
    let mut out = Vec::new();
    Http::new().encode_error(err, &mut out);
    String::from_utf8(out).unwrap()
}

/// The status code `Http` answers `input` with when it is refused.
fn refusal(codec: &mut Http, input: &[u8]) -> u16 {
    let err = decode_all(codec, input, input.len(), |_| ()).expect_err("refused");
    let mut out = Vec::new();
    codec.encode_error(&err, &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
    text[9..12].parse().unwrap()
}

fn header_of<'t>(response: &'t str, name: &str) -> Option<&'t str> {
    let head = response.split("\r\n\r\n").next().unwrap();
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(": "))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

const THREE: &[u8] = b"GET /a?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n\
    POST /rpc HTTP/1.1\r\nHost: h\r\nContent-Type: text/xml\r\nContent-Length: 11\r\n\r\nhello world\
    POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";

fn three_expected() -> Vec<Parts> {
    let h = |n: &str, v: &str| (n.to_owned(), v.as_bytes().to_vec());
    vec![
        Parts {
            method: "GET".into(),
            target: "/a?x=1".into(),
            version: 1,
            headers: vec![h("Host", "example.com"), h("Accept", "*/*")],
            body: vec![],
            keep_alive: true,
        },
        Parts {
            method: "POST".into(),
            target: "/rpc".into(),
            version: 1,
            headers: vec![
                h("Host", "h"),
                h("Content-Type", "text/xml"),
                h("Content-Length", "11"),
            ],
            body: b"hello world".to_vec(),
            keep_alive: true,
        },
        Parts {
            method: "POST".into(),
            target: "/up".into(),
            version: 1,
            headers: vec![h("Host", "h"), h("Transfer-Encoding", "chunked")],
            body: b"hello world".to_vec(),
            keep_alive: true,
        },
    ]
}

#[test]
fn requests_split_at_every_byte_boundary() {
    for chunk in 1..=THREE.len() {
        assert_eq!(decode(THREE, chunk).unwrap(), three_expected(), "chunk {chunk}");
    }
}

#[test]
fn several_requests_in_one_buffer() {
    let mut input = THREE.to_vec();
    input.extend_from_slice(THREE);
    let mut expected = three_expected();
    expected.extend(three_expected());
    assert_eq!(decode(&input, input.len()).unwrap(), expected);
}

#[test]
fn request_accessors() {
    let mut codec = Http::new();
    let mut buf = b"GET /p/q?a=b&c HTTP/1.1\r\nHost: h\r\nX-One:  1 \r\nx-one: 2\r\nEmpty:\r\n\r\n".to_vec();
    let Decoded::Request { request: r, .. } = codec.decode(&mut buf).unwrap() else {
        panic!()
    };
    assert_eq!(r.path(), "/p/q");
    assert_eq!(r.query(), Some("a=b&c"));
    assert_eq!(r.target(), "/p/q?a=b&c");
    assert_eq!(r.header("X-ONE"), Some(&b"1"[..]), "first of the name, trimmed");
    assert_eq!(r.header_str("x-one"), Some("1"));
    assert_eq!(r.header("empty"), Some(&b""[..]));
    assert_eq!(r.header("missing"), None);
    assert_eq!(r.headers().len(), 4);
    assert!(!r.is_head() && !r.is_chunked() && r.content_length().is_none());
    assert!(format!("{r:?}").contains("/p/q"));
}

#[test]
fn empty_lines_before_a_request_are_skipped() {
    let p = decode(b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 1).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].target, "/");
}

#[test]
fn chunked_bodies_split_at_every_byte() {
    let input: &[u8] = b"PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n\
        1\r\na\r\n0010 ; name=\"v\"\r\n0123456789abcdef\r\nA\r\n0123456789\r\n000\r\nT: 1\r\nU: 2\r\n\r\n\
        GET /next HTTP/1.1\r\nHost: h\r\n\r\n";
    for chunk in 1..=input.len() {
        let p = decode(input, chunk).unwrap();
        assert_eq!(p.len(), 2, "chunk {chunk}");
        assert_eq!(p[0].body, b"a0123456789abcdef0123456789", "chunk {chunk}");
        assert_eq!(p[1].target, "/next", "the next request is intact (chunk {chunk})");
    }
}

#[test]
fn chunked_body_is_dechunked_in_place() {
    let mut codec = Http::new();
    let mut buf =
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nrest"
            .to_vec();
    let start = buf.as_ptr() as usize;
    let Decoded::Request { request, len } = codec.decode(&mut buf).unwrap() else {
        panic!()
    };
    assert_eq!(request.body(), b"abcde");
    assert!((request.body().as_ptr() as usize) >= start && (request.body().as_ptr() as usize) < start + len);
    assert!(request.is_chunked());
    assert_eq!(&buf[len..], b"rest");
}

#[test]
fn bad_chunk_syntax_is_400() {
    let head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "x\r\n",                  // not hex
        "\r\n",                   // no size
        "3\r\nabcX\r\n0\r\n\r\n", // no CRLF after the data
        "3\r\nabc\nX",            // LF alone after the data
        "3\nabc\r\n",             // LF alone after the size
        "3 4\r\nabc\r\n",         // junk after the size
        "1234567890abcdef0\r\n",  // too many digits
        "3;a\rb\r\nabc\r\n",      // CR inside an extension
    ] {
        let input = format!("{head}{body}");
        let e = decode(input.as_bytes(), 1).expect_err(body);
        assert!(matches!(e, ProtocolError::Malformed(_)), "{body:?}: {e:?}");
        assert_eq!(refusal(&mut Http::new(), input.as_bytes()), 400, "{body:?}");
    }
}

/// Issue 14: one rule for line ends. A bare LF is refused with 400 in every line of a
/// request: the start line, a header field, the end of the head, a chunk-size line,
/// after a chunk's data, a trailer field and the end of the trailers.
#[test]
fn bare_lf_is_refused_everywhere_with_400() {
    let chunked = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    let cases = [
        ("the start line", "GET / HTTP/1.1\nHost: h\r\n\r\n".to_owned()),
        (
            "an empty line before it",
            "\nGET / HTTP/1.1\r\nHost: h\r\n\r\n".to_owned(),
        ),
        (
            "a header field",
            "GET / HTTP/1.1\r\nHost: h\nAccept: */*\r\n\r\n".to_owned(),
        ),
        (
            "the end of the head",
            "GET / HTTP/1.1\r\nHost: h\r\n\n".to_owned(),
        ),
        (
            "a bare-LF head throughout",
            "GET / HTTP/1.1\nHost: h\n\n".to_owned(),
        ),
        ("a chunk-size line", format!("{chunked}3\nabc\r\n0\r\n\r\n")),
        (
            "the last chunk-size line",
            format!("{chunked}3\r\nabc\r\n0\n\r\n"),
        ),
        ("after chunk data", format!("{chunked}3\r\nabc\n0\r\n\r\n")),
        ("a trailer field", format!("{chunked}3\r\nabc\r\n0\r\nT: 1\n\r\n")),
        (
            "the end of the trailers",
            format!("{chunked}3\r\nabc\r\n0\r\nT: 1\r\n\n"),
        ),
        ("the end of no trailers", format!("{chunked}3\r\nabc\r\n0\r\n\n")),
    ];
    for (place, input) in &cases {
        for chunk in [1, input.len()] {
            let e = decode(input.as_bytes(), chunk).expect_err(place);
            assert!(
                matches!(&e, ProtocolError::Malformed(why) if why.contains("CRLF")),
                "{place}: {e:?}"
            );
        }
        assert_eq!(refusal(&mut Http::new(), input.as_bytes()), 400, "{place}");
        // The same request with CRLF line ends is served.
        let fixed = input.replace("\r\n", "\n").replace('\n', "\r\n");
        assert_eq!(
            decode(fixed.as_bytes(), 1).map(|p| p.len()),
            Ok(1),
            "{place}: {fixed:?}"
        );
    }
    // A head with another fault too (a 501 alone) is refused for its bare LF: 400.
    let gzip = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nHost: h\r\n\r\n";
    assert_eq!(refusal(&mut Http::new(), gzip.as_bytes()), 501);
    let both = gzip.replacen("gzip\r\n", "gzip\n", 1);
    assert_eq!(refusal(&mut Http::new(), both.as_bytes()), 400);
    assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\r\n\r\n"), 505);
    assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\n\r\n"), 400);
}

/// The head check looks only where httparse found the lines: each line end of a
/// head, made a bare LF in turn, is refused (and `has_bare_lf`, the plain definition,
/// agrees in debug builds: `head_lines_end_in_crlf` asserts it on every head).
#[test]
fn a_bare_lf_at_any_line_end_of_the_head_is_refused() {
    let head = "\r\n\r\nPOST /a?b HTTP/1.1\r\nHost: h\r\nEmpty:\r\nSpaces:   \r\n\
                Accept: */*\r\nContent-Length: 2\r\n\r\nok";
    assert_eq!(decode(head.as_bytes(), 1).map(|p| p.len()), Ok(1));
    let ends: Vec<usize> = head.match_indices("\r\n").map(|(i, _)| i).collect();
    assert_eq!(ends.len(), 9);
    for cr in ends {
        let mut input = head.as_bytes().to_vec();
        input.remove(cr);
        let shown = String::from_utf8_lossy(&input).into_owned();
        for chunk in [1, input.len()] {
            match decode(&input, chunk) {
                Err(ProtocolError::Malformed(why)) => assert!(why.contains("CRLF"), "{shown:?}: {why}"),
                other => panic!("{shown:?}: {other:?}"),
            }
        }
    }
    for (b, bare) in [
        (&b""[..], false),
        (b"\n", true),
        (b"\r\n", false),
        (b"a\r\nb\n\r\n", true),
        (b"\n\r", true),
    ] {
        assert_eq!(has_bare_lf(b), bare, "{:?}", String::from_utf8_lossy(b));
    }
}

#[test]
fn chunked_body_too_large_is_413_before_the_data() {
    let mut codec = Http::new().max_body(10);
    let input = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n";
    let e = decode_all(&mut codec, input, 1, |_| ()).unwrap_err();
    assert_eq!(
        e,
        ProtocolError::TooLarge {
            what: "body",
            limit: 10
        }
    );
    assert_eq!(refusal(&mut Http::new().max_body(10), input), 413);
}

#[test]
fn expect_100_continue_is_answered_once() {
    let mut codec = Http::new();
    let request = b"POST /rpc HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello";
    let head_len = request.len() - 5;
    let mut interims = 0;
    for n in 0..request.len() {
        let mut buf = request[..n].to_vec();
        match codec.decode(&mut buf).unwrap() {
            Decoded::Incomplete { interim: Some(bytes) } => {
                assert_eq!(bytes, b"HTTP/1.1 100 Continue\r\n\r\n");
                assert_eq!(n, head_len, "sent as soon as the head is complete");
                interims += 1;
            }
            Decoded::Incomplete { interim: None } => {}
            Decoded::Request { .. } => panic!("complete at {n}"),
        }
    }
    assert_eq!(interims, 1);
    let mut buf = request.to_vec();
    let Decoded::Request { request: r, .. } = codec.decode(&mut buf).unwrap() else {
        panic!()
    };
    assert!(r.expects_continue());
    assert_eq!(r.body(), b"hello");
    // The next request on the connection gets its own 100 Continue.
    let mut buf = request[..head_len].to_vec();
    assert!(matches!(
        codec.decode(&mut buf).unwrap(),
        Decoded::Incomplete { interim: Some(_) }
    ));
    // So does the first request of the next connection (which has a codec of its own).
    let mut codec = Http::new();
    assert!(matches!(
        codec.decode(&mut buf).unwrap(),
        Decoded::Incomplete { interim: Some(_) }
    ));
}

#[test]
fn no_100_continue_when_the_body_is_there_or_for_http_1_0() {
    let mut codec = Http::new();
    let mut buf =
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi".to_vec();
    assert!(matches!(codec.decode(&mut buf).unwrap(), Decoded::Request { .. }));
    let mut buf = b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n".to_vec();
    assert!(matches!(codec.decode(&mut buf).unwrap(), Decoded::Request { .. }));
    let mut buf = b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n".to_vec();
    assert!(matches!(
        codec.decode(&mut buf).unwrap(),
        Decoded::Incomplete { interim: None }
    ));
    // Chunked bodies get it too.
    let mut codec = Http::new();
    let mut buf =
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    assert!(matches!(
        codec.decode(&mut buf).unwrap(),
        Decoded::Incomplete { interim: Some(_) }
    ));
}

#[test]
fn keep_alive_decisions() {
    let cases: &[(&str, bool, bool, Option<&str>)] = &[
        // request, last, closes, Connection header in the response
        ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, false, None),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
            true,
            Some("close"),
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, CLOSE\r\n\r\n",
            false,
            true,
            Some("close"),
        ),
        ("GET / HTTP/1.1\r\nHost: h\r\n\r\n", true, true, Some("close")),
        ("GET / HTTP/1.0\r\n\r\n", false, true, Some("close")),
        (
            "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            false,
            false,
            Some("keep-alive"),
        ),
        (
            "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            true,
            true,
            Some("close"),
        ),
    ];
    for (req, last, closes, header) in cases {
        let (text, outcome) = respond_to(req.as_bytes(), *last, |_, res| {
            res.write_all(b"hi").unwrap();
        });
        assert_eq!(outcome.close, *closes, "{req:?} last={last}");
        assert_eq!(
            header_of(&text, "connection"),
            *header,
            "{req:?} last={last}: {text}"
        );
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\nhi"), "{text}");
    }
    // The handler can close too.
    let (text, outcome) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.header("Connection", "close");
    });
    assert!(outcome.close);
    assert_eq!(header_of(&text, "connection"), Some("close"));
}

#[test]
fn response_head() {
    let (text, outcome) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.write_all(b"Hello, ").unwrap();
        res.status(404).content_type("text/plain").header("X-A", "b");
        res.write_all(b"World!").unwrap();
    });
    assert!(outcome.file.is_none() && !outcome.close);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "Hello, World!");
    let mut lines = head.lines();
    assert_eq!(lines.next(), Some("HTTP/1.1 404 Not Found"));
    assert_eq!(header_of(&text, "content-type"), Some("text/plain"));
    assert_eq!(header_of(&text, "x-a"), Some("b"));
    assert_eq!(header_of(&text, "content-length"), Some("13"));
    let date = header_of(&text, "date").unwrap();
    assert_eq!(date.len(), 29);
    assert!(date.ends_with(" GMT"), "{date}");

    // Defaults: 200, no Content-Type, an empty body with Content-Length 0.
    let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, _| {});
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"));
    assert_eq!(header_of(&text, "content-type"), None);
    assert_eq!(header_of(&text, "content-length"), Some("0"));

    // The codec's headers are its own; header injection is refused.
    let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.header("Content-Length", "99")
            .header("X-Evil", "a\r\nSet-Cookie: x")
            .header("Bad Name", "v")
            .status(204);
    });
    assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{text}");
    assert_eq!(
        header_of(&text, "content-length"),
        None,
        "no Content-Length with 204: {text}"
    );
    assert!(!text.contains("Evil") && !text.contains("Bad"), "{text}");

    let (text, _) = respond_to(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.status(299);
    });
    assert!(text.starts_with("HTTP/1.1 299 \r\n"), "{text}");
}

#[test]
fn head_requests_get_the_head_only() {
    let (text, outcome) = respond_to(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n", false, |req, res| {
        assert!(req.is_head());
        res.content_type("text/plain")
            .write_all(b"Hello, World!")
            .unwrap();
    });
    assert_eq!(header_of(&text, "content-length"), Some("13"));
    assert!(text.ends_with("\r\n\r\n"), "no body: {text}");
    assert!(!outcome.close);

    let file = File::open("Cargo.toml").unwrap();
    let (text, outcome) = respond_to(b"HEAD /f HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.send_file(file, 10..110);
    });
    assert_eq!(header_of(&text, "content-length"), Some("100"));
    assert!(text.ends_with("\r\n\r\n"));
    assert!(outcome.file.is_none(), "no file for HEAD");
}

#[test]
fn send_file_sets_the_length_and_the_outcome() {
    let file = File::open("Cargo.toml").unwrap();
    let (text, outcome) = respond_to(b"GET /f HTTP/1.1\r\nHost: h\r\n\r\n", false, |_, res| {
        res.write_all(b"ab").unwrap();
        res.send_file(file, 10..110);
    });
    assert_eq!(header_of(&text, "content-length"), Some("102"));
    assert!(text.ends_with("\r\n\r\nab"));
    let body = outcome.file.expect("a file");
    assert_eq!(body.range, 10..110);
}

#[test]
fn pipelined_responses_share_the_output_buffer() {
    let mut codec = Http::new();
    let mut input =
        b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nHEAD /2 HTTP/1.1\r\nHost: h\r\n\r\nGET /3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
            .to_vec();
    let mut out = Vec::new();
    let mut at = 0;
    let mut closes = Vec::new();
    while at < input.len() {
        let Decoded::Request { request, len } = codec.decode(&mut input[at..]).unwrap() else {
            panic!()
        };
        let mut res = codec.respond(&request, &mut out, false);
        res.write_all(request.target().as_bytes()).unwrap();
        closes.push(res.finish().close);
        at += len;
    }
    assert_eq!(closes, [false, false, true]);
    let text = String::from_utf8(out).unwrap();
    let responses: Vec<&str> = text.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(responses.len(), 3, "{text}");
    assert!(responses[0].ends_with("\r\n\r\n/1"));
    assert!(responses[1].ends_with("\r\n\r\n"), "HEAD: no body");
    assert!(responses[2].ends_with("Connection: close\r\n\r\n/3"));
}

#[test]
fn error_replies() {
    for (err, status) in [
        (ProtocolError::Malformed("x".into()), "400 Bad Request"),
        (ProtocolError::Timeout, "408 Request Timeout"),
        (
            ProtocolError::TooLarge {
                what: "body",
                limit: 1,
            },
            "413 Content Too Large",
        ),
        (
            ProtocolError::HeaderTooLarge { limit: 1 },
            "431 Request Header Fields Too Large",
        ),
        (ProtocolError::Unsupported("gzip".into()), "501 Not Implemented"),
        (
            ProtocolError::Unsupported(UNSUPPORTED_VERSION.into()),
            "505 HTTP Version Not Supported",
        ),
    ] {
        let text = error_reply(&err);
        assert!(text.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{text}");
        assert_eq!(header_of(&text, "connection"), Some("close"));
        assert_eq!(
            header_of(&text, "content-type"),
            Some("text/plain; charset=utf-8")
        );
        let body = text.split_once("\r\n\r\n").unwrap().1;
        assert!(body.starts_with(status) && body.ends_with('\n'), "{body:?}");
        assert_eq!(
            header_of(&text, "content-length"),
            Some(body.len().to_string().as_str())
        );
    }
}

#[test]
fn malformed_requests_are_400() {
    for input in [
        &b"GET / HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n"[..],
        b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
        b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1\r\n folded: x\r\nHost: h\r\n\r\n",
        b"GET / XTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(
            refusal(&mut Http::new(), input),
            400,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    // A repeated identical Content-Length is fine.
    let p = decode_one(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab")
        .unwrap();
    assert_eq!(p.body, b"ab");
}

/// Issue 31: RFC 9112 §3.2. An HTTP/1.1 request without `Host`, and any request with
/// two, is a 400 (and the codec's error reply closes the connection); HTTP/1.0 may
/// leave it out.
#[test]
fn issue_31_a_missing_or_repeated_host_is_400() {
    let refused = |input: &[u8], why: &str| {
        let shown = String::from_utf8_lossy(input).into_owned();
        for chunk in [1, input.len()] {
            match decode(input, chunk) {
                Err(ProtocolError::Malformed(w)) => assert_eq!(w, why, "{shown:?}"),
                other => panic!("{shown:?} in pieces of {chunk}: {other:?}"),
            }
        }
        assert_eq!(refusal(&mut Http::new(), input), 400, "{shown:?}");
    };
    refused(b"GET / HTTP/1.1\r\n\r\n", NO_HOST);
    refused(b"GET / HTTP/1.1\r\nAccept: */*\r\nX-Host: h\r\n\r\n", NO_HOST);
    // The absolute form names the host, but the field is required all the same.
    refused(b"GET http://example.com/ HTTP/1.1\r\n\r\n", NO_HOST);
    refused(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", SEVERAL_HOSTS);
    refused(
        b"GET / HTTP/1.1\r\nhost: a\r\nX: 1\r\nHOST: a\r\n\r\n",
        SEVERAL_HOSTS,
    );
    refused(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", SEVERAL_HOSTS);
    // Refused once the head is there, before any of the body is waited for.
    refused(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n", NO_HOST);
    // In a pipeline: the requests before it are served, then the 400.
    let mut codec = Http::new();
    let two = b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\n\r\n";
    let mut served = Vec::new();
    let e = decode_all(&mut codec, two, two.len(), |r| served.push(r.target().to_owned()))
        .expect_err("the second has no Host");
    assert_eq!((served, e), (vec!["/1".to_owned()], malformed(NO_HOST)));
    let mut out = Vec::new();
    codec.encode_error(&malformed(NO_HOST), &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.ends_with(
            "\r\n\r\n400 Bad Request: malformed request: no Host header (HTTP/1.1 requires one)\n"
        ),
        "the reason, for a person reading it: {text}"
    );

    // Served: one Host (an empty one too, RFC 9112 §3.2's "no authority"), in any case;
    // HTTP/1.0 without one.
    for input in [
        &b"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhOsT: h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: h\r\n\r\n",
    ] {
        let p = decode_one(input).unwrap_or_else(|e| panic!("{:?}: {e:?}", String::from_utf8_lossy(input)));
        assert_eq!(p.target, "/");
    }
}

#[test]
fn oversize_requests_are_refused_early() {
    // A head larger than the limit, before it ends.
    let mut codec = Http::new().max_header_bytes(100);
    let mut input = b"GET / HTTP/1.1\r\nHost: h\r\nX-Long: ".to_vec();
    input.extend_from_slice(&[b'a'; 200]);
    assert_eq!(refusal(&mut codec, &input), 431);
    let e = decode_all(&mut Http::new().max_header_bytes(100), &input, 7, |_| ()).unwrap_err();
    assert_eq!(e, ProtocolError::HeaderTooLarge { limit: 100 });
    // A complete head larger than the limit.
    input.extend_from_slice(b"\r\n\r\n");
    assert_eq!(refusal(&mut codec, &input), 431);
    // Too many headers.
    let mut many = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
    for i in 0..65 {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(refusal(&mut Http::new(), &many), 431);
    assert_eq!(
        refusal(
            &mut Http::new().max_headers(3),
            b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n"
        ),
        431
    );
    assert_eq!(
        decode(b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 1)
            .unwrap()
            .len(),
        1
    );
    // A body larger than the limit, from its Content-Length alone.
    let input = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n";
    assert_eq!(refusal(&mut Http::new(), input), 413);
    let input = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n";
    assert!(matches!(refusal(&mut Http::new(), input), 400 | 413));
    assert_eq!(Http::new().max_request_size(), 8 * 1024 + 1024 * 1024);
    assert_eq!(
        Http::new().max_header_bytes(1000).max_body(10).max_request_size(),
        1010
    );
}

#[test]
fn unsupported_versions_and_codings() {
    assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/2.0\r\n\r\n"), 505);
    assert_eq!(refusal(&mut Http::new(), b"GET / HTTP/1.2\r\n\r\n"), 505);
    assert_eq!(
        refusal(
            &mut Http::new(),
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        ),
        501
    );
    assert_eq!(
        refusal(
            &mut Http::new(),
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"
        ),
        501
    );
    let e = decode(b"GET / HTTP/3.0\r\n", 1).unwrap_err();
    assert!(matches!(e, ProtocolError::Unsupported(_)), "{e:?}");
}

/// Encodes a request: with `Content-Length`, or chunked with chunks of the given sizes.
fn encode(p: &Parts, chunks: Option<&[usize]>) -> Vec<u8> {
    let mut r = format!("{} {} HTTP/1.{}\r\n", p.method, p.target, p.version).into_bytes();
    for (n, v) in &p.headers {
        r.extend_from_slice(n.as_bytes());
        r.extend_from_slice(b": ");
        r.extend_from_slice(v);
        r.extend_from_slice(b"\r\n");
    }
    match chunks {
        None => {
            r.extend_from_slice(b"\r\n");
            r.extend_from_slice(&p.body);
        }
        Some(sizes) => {
            r.extend_from_slice(b"\r\n");
            let mut rest = &p.body[..];
            let mut sizes = sizes.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap()).clamp(1, rest.len());
                r.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                r.extend_from_slice(&rest[..n]);
                r.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            r.extend_from_slice(b"0\r\n\r\n");
        }
    }
    r
}

fn arb_parts() -> impl Strategy<Value = Parts> {
    (
        "[A-Z]{1,10}",
        "/[a-zA-Z0-9._~%!$&'()*+,;=:@/?-]{0,40}",
        0u8..=1,
        prop::collection::vec(("x-[a-z0-9-]{1,12}", "[!-~]([ -~]{0,30}[!-~])?"), 0..10),
        prop::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(method, target, version, headers, body)| Parts {
            method,
            target,
            version,
            // The one Host an HTTP/1.1 request must have (HTTP/1.0 may have it too).
            headers: std::iter::once(("Host".to_owned(), b"h".to_vec()))
                .chain(headers.into_iter().map(|(n, v)| (n, v.into_bytes())))
                .collect(),
            body,
            keep_alive: version == 1,
        })
}

proptest! {
    #[test]
    fn encoded_requests_decode_to_their_parts(
        p in arb_parts(),
        chunked in any::<bool>(),
        sizes in prop::collection::vec(1usize..100, 1..5),
        cut in 1usize..200,
    ) {
        let mut p = p;
        let mut expected = p.clone();
        let chunked = chunked && p.version == 1;
        if chunked {
            p.headers.push(("Transfer-Encoding".into(), b"chunked".to_vec()));
        } else {
            p.headers.push(("Content-Length".into(), p.body.len().to_string().into_bytes()));
        }
        expected.headers = p.headers.clone();
        let bytes = encode(&p, chunked.then_some(&sizes[..]));
        let mut twice = bytes.clone();
        twice.extend_from_slice(&bytes);
        let got = decode(&twice, cut).unwrap();
        prop_assert_eq!(got, vec![expected.clone(), expected]);
    }
}

//! The `dns` example's engine: zones read from master files and turned into precomputed
//! answers at load time, and the query path, which parses the header and the question by
//! hand and copies the precomputed answer behind them.
//!
//! It knows nothing of appsrv, so that the fuzz target (`fuzz/fuzz_targets/dns_query.rs`)
//! and the benchmark (`benches/dns.rs`) include this file as it is (`#[path]`), with
//! hickory-proto as their only dependency.
//!
//! # Why precomputed answers
//!
//! An authoritative server's answer to (name, type) is fixed until the zone changes, and
//! all that varies from one query to the next is the header's id and flags, the case of
//! the question's name (resolvers randomise it), whether the query had an EDNS OPT record,
//! and the size the answer must fit in. So [`Zones::load`] builds, for every name and
//! every type present there, the wire bytes of the answer, authority and additional
//! sections, compressed against a question that holds the node's name at offset 12; the
//! query path writes the header, copies the question as the client sent it (its case
//! kept), appends those bytes and an OPT record when the query had one. Names in the
//! precomputed bytes point (RFC 1035 compression) at the question, so the answer's owner
//! names take the question's case, as resolvers that randomise it expect.
//!
//! Answers that depend on a name that is not in the zone (NXDOMAIN, a referral for a name
//! below a delegation) are the precomputed answer for the closest name that is (the apex's
//! SOA, the cut's NS set) behind a question that is `d` bytes longer: every compression
//! pointer in those bytes then moves by exactly `d` (the node's name is the question's
//! suffix, `d` bytes further on, and everything after the question moves by `d` too), so
//! the query path adds `d` to the pointers it recorded at load time. Pointers are only
//! made to offsets below `0x4000 - 256`, so that the shift cannot overflow them.
//!
//! The cost is memory (one copy of a record per answer it appears in) and load time, which
//! for the zones a small server serves is nothing; the gain is that a query costs a few
//! bounds checks, one hash lookup and one copy, with no allocation (measured in
//! `benches/dns.rs`, see the example's header).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;
use std::str::FromStr;

use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_proto::serialize::txt::{Parser, RDataParser};

/// The size of a DNS header.
pub(crate) const HEADER: usize = 12;
/// The largest UDP answer without EDNS (RFC 1035 §4.2.1).
pub(crate) const MIN_UDP: u16 = 512;
/// The default largest UDP answer with EDNS: the DNS Flag Day 2020 value, which NSD and
/// Knot use too: above it, answers risk IP fragmentation on real paths.
pub(crate) const DEFAULT_MAX_UDP: u16 = 1232;
/// The most `--max-udp-size` may be.
pub(crate) const MAX_UDP: u16 = 4096;
/// The longest CNAME chain followed inside a zone (a loop stops it earlier).
pub(crate) const MAX_CHAIN: usize = 8;

const QR: u16 = 0x8000;
const AA: u16 = 0x0400;
const TC: u16 = 0x0200;
const RD: u16 = 0x0100;
const CD: u16 = 0x0010;

const NOERROR: u16 = 0;
const FORMERR: u16 = 1;
const NXDOMAIN: u16 = 3;
const NOTIMP: u16 = 4;
const REFUSED: u16 = 5;

const T_NS: u16 = 2;
const T_CNAME: u16 = 5;
const T_SOA: u16 = 6;
const T_A: u16 = 1;
const T_AAAA: u16 = 28;
const T_OPT: u16 = 41;
const T_DS: u16 = 43;
const T_IXFR: u16 = 251;
const T_AXFR: u16 = 252;
const T_ANY: u16 = 255;
const CLASS_IN: u16 = 1;

/// The highest offset a compression pointer is made to: a pointer holds 14 bits, and the
/// query path may add up to 255 to it (see the module documentation).
const MAX_POINTER_TARGET: usize = 0x3fff - 255;

// ---------------------------------------------------------------------------------------
// The query path
// ---------------------------------------------------------------------------------------

/// How the query came, which decides the size its answer must fit in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// A UDP datagram: the answer fits in 512 bytes, or in the client's EDNS size clamped
    /// to `[512, max_udp]`; beyond, it is truncated (TC=1, the question only).
    Udp,
    /// A query over TCP: answers up to 65535 bytes.
    Tcp,
    /// A UDP query the rate limit lets through as a "slip": the answer to a good query is
    /// TC=1 with the question and no records, which sends a real resolver to TCP; a bad
    /// query gets the same error it would otherwise.
    Slip,
}

/// What the query path did with a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// An answer is in `out`, with this RCODE (extended: 16 is BADVERS).
    Answered(u16),
    /// No answer: the reason.
    Dropped(&'static str),
}

/// The query's EDNS(0) OPT record, as far as the answer needs it.
#[derive(Clone, Copy)]
struct Edns {
    /// The client's UDP payload size.
    size: u16,
    /// The DO bit, copied into the answer's OPT (RFC 3225 §3).
    dnssec_ok: bool,
    /// The version the client speaks; only 0 is served.
    version: u8,
}

/// Answers `query` from `zones` into `out` (cleared first). Never panics and never
/// allocates beyond `out`'s growth, whatever the bytes.
///
/// Dropped (no answer): shorter than a header, or QR=1 (never answer an answer: two
/// servers would bounce it forever). Answered with the header only (id, opcode and RD
/// echoed): FORMERR for a malformed query, NOTIMP for an opcode other than QUERY.
///
/// `max_udp` (`--max-udp-size`, 512 to 4096) is the largest UDP answer with EDNS, and the
/// size the answer's OPT record advertises.
pub(crate) fn answer(
    zones: &Zones,
    query: &[u8],
    transport: Transport,
    max_udp: u16,
    out: &mut Vec<u8>,
) -> Outcome {
    out.clear();
    if query.len() < HEADER {
        return Outcome::Dropped("shorter than a DNS header");
    }
    let flags = be16(query, 2);
    if flags & QR != 0 {
        return Outcome::Dropped("a response (QR=1), not a query");
    }
    if (flags >> 11) & 0xf != 0 {
        return error(query, NOTIMP, out);
    }
    if be16(query, 4) != 1 {
        return error(query, FORMERR, out);
    }
    // The question name: its labels walked (the offset of each kept, to walk up the tree
    // for a name not in the zones), then copied into `key` and lowercased in one pass (a
    // loop the compiler vectorises; length bytes are below 64, so lowercasing every byte
    // touches letters only).
    let mut labels = [0u8; 128];
    let mut nlabels = 0;
    let mut at = HEADER;
    loop {
        let Some(&len) = query.get(at) else {
            return error(query, FORMERR, out);
        };
        let len = usize::from(len);
        if len & 0xc0 != 0 {
            // A compression pointer in the first name of a message can only point at
            // itself or forward (a loop, or forbidden by RFC 1035 §4.1.4); 0x40 and 0x80
            // are not label types of DNS today.
            return error(query, FORMERR, out);
        }
        if len == 0 {
            break;
        }
        let name_len = at - HEADER;
        if name_len + 1 + len >= 255 {
            return error(query, FORMERR, out);
        }
        labels[nlabels] = name_len as u8;
        nlabels += 1;
        at += 1 + len;
    }
    let qname_len = at + 1 - HEADER;
    let Some(tail) = query.get(at + 1..at + 5) else {
        return error(query, FORMERR, out);
    };
    let qtype = be16(tail, 0);
    let qclass = be16(tail, 2);
    let question = &query[HEADER..at + 5];
    let mut key = [0u8; 255];
    let key = &mut key[..qname_len];
    key.copy_from_slice(&question[..qname_len]);
    for b in key.iter_mut() {
        *b |= u8::from(b.wrapping_sub(b'A') < 26) << 5;
    }
    let edns = match scan_records(query, at + 5) {
        Ok(edns) => edns,
        Err(()) => return error(query, FORMERR, out),
    };
    let max_udp = max_udp.clamp(MIN_UDP, MAX_UDP);
    let header = Header { query, question };
    let opt = edns.map(|e| Opt {
        edns: e,
        size: max_udp,
    });
    if let Some(opt) = opt
        && opt.edns.version != 0
    {
        // BADVERS (16): 0 in the header's 4 bits, 1 in the OPT's extended RCODE.
        return header.bare(out, NOERROR, Some(opt), 1);
    }
    let limit = match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp | Transport::Slip => {
            usize::from(edns.map_or(MIN_UDP, |e| e.size.clamp(MIN_UDP, max_udp)))
        }
    };
    if qtype == T_OPT {
        return error(query, FORMERR, out);
    }
    if qclass != CLASS_IN || qtype == T_AXFR || qtype == T_IXFR {
        return header.bare(out, REFUSED, opt, 0);
    }
    if transport == Transport::Slip {
        return header.truncated(out, NOERROR, opt);
    }
    match zones.lookup(key, &labels[..nlabels], qtype) {
        None => header.bare(out, REFUSED, opt, 0),
        Some((ans, shift, rcode)) => header.emit(out, ans, shift, rcode, opt, limit),
    }
}

/// The OPT record of the answer: the query's, and the size the server advertises.
#[derive(Clone, Copy)]
struct Opt {
    edns: Edns,
    size: u16,
}

impl Opt {
    const LEN: usize = 11;

    fn write(self, out: &mut Vec<u8>, ext_rcode: u8) {
        out.push(0); // the root
        out.extend_from_slice(&T_OPT.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.push(ext_rcode);
        out.push(0); // version 0
        out.push(if self.edns.dnssec_ok { 0x80 } else { 0 });
        out.push(0);
        out.extend_from_slice(&[0, 0]); // no options
    }
}

/// The parts of the query every answer repeats.
struct Header<'q> {
    query: &'q [u8],
    /// The question as the client sent it: name, type, class.
    question: &'q [u8],
}

impl Header<'_> {
    fn flags(&self, extra: u16) -> u16 {
        QR | (be16(self.query, 2) & (RD | CD)) | extra
    }

    fn start(&self, out: &mut Vec<u8>, flags: u16, counts: [u16; 4]) {
        out.extend_from_slice(&self.query[..2]);
        out.extend_from_slice(&flags.to_be_bytes());
        for c in counts {
            out.extend_from_slice(&c.to_be_bytes());
        }
    }

    /// The question and no records (REFUSED, BADVERS), with an OPT when the query had one.
    fn bare(&self, out: &mut Vec<u8>, rcode: u16, opt: Option<Opt>, ext: u8) -> Outcome {
        self.start(out, self.flags(rcode), [1, 0, 0, u16::from(opt.is_some())]);
        out.extend_from_slice(self.question);
        if let Some(opt) = opt {
            opt.write(out, ext);
        }
        Outcome::Answered((u16::from(ext) << 4) | rcode)
    }

    /// TC=1, the question and no records.
    fn truncated(&self, out: &mut Vec<u8>, extra: u16, opt: Option<Opt>) -> Outcome {
        self.start(out, self.flags(extra | TC), [1, 0, 0, u16::from(opt.is_some())]);
        out.extend_from_slice(self.question);
        if let Some(opt) = opt {
            opt.write(out, 0);
        }
        Outcome::Answered(extra & 0xf)
    }

    /// A precomputed answer behind the question, its pointers moved by `shift`; without
    /// the additional section if the whole does not fit in `limit`, truncated if the
    /// answer and authority sections do not.
    fn emit(
        &self,
        out: &mut Vec<u8>,
        ans: &Answer,
        shift: u16,
        rcode: u16,
        opt: Option<Opt>,
        limit: usize,
    ) -> Outcome {
        let fixed = HEADER + self.question.len() + if opt.is_some() { Opt::LEN } else { 0 };
        let flags = ans.flags | rcode;
        let (len, ar) = if fixed + ans.bytes.len() <= limit {
            (ans.bytes.len(), ans.counts[2])
        } else if fixed + ans.required <= limit {
            (ans.required, 0)
        } else {
            return self.truncated(out, flags, opt);
        };
        let ar = ar + u16::from(opt.is_some());
        self.start(out, self.flags(flags), [1, ans.counts[0], ans.counts[1], ar]);
        out.extend_from_slice(self.question);
        let base = out.len();
        out.extend_from_slice(&ans.bytes[..len]);
        if shift != 0 {
            for &p in ans.pointers.iter() {
                let p = usize::from(p);
                if p + 2 > len {
                    break; // sorted: the rest are in the additional section left out
                }
                let at = base + p;
                let v = u16::from_be_bytes([out[at], out[at + 1]]) + shift;
                out[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
        }
        if let Some(opt) = opt {
            opt.write(out, 0);
        }
        Outcome::Answered(rcode)
    }
}

/// The header alone, id, opcode and RD echoed, with `rcode` (FORMERR, NOTIMP): the query
/// may not be readable past its header.
fn error(query: &[u8], rcode: u16, out: &mut Vec<u8>) -> Outcome {
    out.clear();
    out.extend_from_slice(&query[..2]);
    let flags = QR | (be16(query, 2) & (0x7800 | RD)) | rcode;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    Outcome::Answered(rcode)
}

/// Walks the answer, authority and additional records of a query from `at`, and returns
/// its OPT record if it has one. `Err` (FORMERR): a record runs past the end, a second
/// OPT, an OPT whose owner is not the root, or whose options are not well framed. Bytes
/// after the last record are ignored. Names are skipped, never followed: a pointer ends a
/// name, so a pointer loop cannot make this loop.
fn scan_records(query: &[u8], mut at: usize) -> Result<Option<Edns>, ()> {
    let an = usize::from(be16(query, 6));
    let ns = usize::from(be16(query, 8));
    let ar = usize::from(be16(query, 10));
    let mut edns = None;
    for i in 0..an + ns + ar {
        let owner = at;
        loop {
            let len = *query.get(at).ok_or(())?;
            match len & 0xc0 {
                0xc0 => {
                    at += 2;
                    break;
                }
                0 if len == 0 => {
                    at += 1;
                    break;
                }
                0 => at += 1 + usize::from(len),
                _ => return Err(()),
            }
        }
        let fixed = query.get(at..at + 10).ok_or(())?;
        let rtype = be16(fixed, 0);
        let rdlen = usize::from(be16(fixed, 8));
        let rdata = query.get(at + 10..at + 10 + rdlen).ok_or(())?;
        if rtype == T_OPT && i >= an + ns {
            if edns.is_some() || at != owner + 1 || query[owner] != 0 {
                return Err(());
            }
            let mut o = 0;
            while o < rdata.len() {
                let head = rdata.get(o..o + 4).ok_or(())?;
                o += 4 + usize::from(be16(head, 2));
            }
            if o != rdata.len() {
                return Err(());
            }
            edns = Some(Edns {
                size: be16(fixed, 2),
                version: fixed[5],
                dnssec_ok: fixed[6] & 0x80 != 0,
            });
        }
        at += 10 + rdlen;
    }
    Ok(edns)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

// ---------------------------------------------------------------------------------------
// The zones, as the query path reads them
// ---------------------------------------------------------------------------------------

/// A precomputed answer: the sections after the question, for a question holding the
/// node's name (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    /// AA, and the RCODE where it is fixed (a CNAME chain that ends in NXDOMAIN).
    flags: u16,
    /// ANCOUNT, NSCOUNT, ARCOUNT.
    counts: [u16; 3],
    /// The answer, authority and additional sections.
    bytes: Box<[u8]>,
    /// The length of the answer and authority sections: what must fit, else TC.
    required: usize,
    /// Where in `bytes` each compression pointer is, in order.
    pointers: Box<[u16]>,
}

/// One name of the zones: a node with records, or an empty non-terminal.
#[derive(Debug)]
struct Node {
    /// The index of its zone in `Zones::zones`.
    zone: u32,
    /// Its name's wire length.
    len: u8,
    /// The delegation it is at or below (the node index of the cut), if any.
    cut: Option<u32>,
    /// The answer for each type present (and ANY), sorted by type.
    answers: Vec<(u16, Answer)>,
    /// The answer for a type not in `answers` (a CNAME node's chain); `None`: NODATA.
    default: Option<Answer>,
    /// At a cut: the referral.
    referral: Option<Answer>,
}

/// One loaded zone.
#[derive(Debug)]
struct Zone {
    /// The apex, as written in the file.
    apex: Name,
    /// The apex's node.
    node: u32,
    /// The negative answer: the SOA in authority (TTL = min(SOA TTL, SOA minimum)) for a
    /// question holding the apex.
    negative: Answer,
    /// Where the zone came from, and its size, for the log.
    source: String,
    records: usize,
    serial: u32,
}

/// FxHash's mix, eight bytes at a time: the keys are short names, either the zones' own or
/// lowercased query names looked up in a table that never changes after load, so
/// SipHash's resistance to chosen keys buys nothing, and hashing byte by byte (FNV) costs
/// a multiplication per byte on the hot path.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        // The bucket is chosen by the low bits, which FxHash's multiplications leave
        // depending on the first bytes only (a length and a label's first letters, the same
        // for most names of a zone): murmur3's finaliser spreads every bit over them.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        self.0 = h;
    }
}

/// Every zone served, as precomputed answers keyed by lowercase wire names.
#[derive(Debug)]
pub(crate) struct Zones {
    names: HashMap<Box<[u8]>, u32, BuildHasherDefault<FxHasher>>,
    nodes: Vec<Node>,
    zones: Vec<Zone>,
}

impl Zones {
    /// The answer for `qname` (lowercase wire form; `labels` the offset of each of its
    /// labels) and `qtype`: the precomputed answer, the shift of its pointers and the
    /// RCODE to add; `None` if no zone holds the name (REFUSED).
    fn lookup(&self, qname: &[u8], labels: &[u8], qtype: u16) -> Option<(&Answer, u16, u16)> {
        let qlen = qname.len();
        if let Some(&i) = self.names.get(qname) {
            let node = &self.nodes[i as usize];
            if let Some(cut) = node.cut {
                let cut_node = &self.nodes[cut as usize];
                // DS is the parent's data: at the cut, the parent answers for itself (and
                // this server has none).
                if !(qtype == T_DS && cut as usize == i as usize) {
                    let referral = cut_node.referral.as_ref()?;
                    return Some((referral, (qlen - usize::from(cut_node.len)) as u16, NOERROR));
                }
            }
            if let Some((_, ans)) = node.answers.iter().find(|(t, _)| *t == qtype) {
                return Some((ans, 0, NOERROR));
            }
            if let Some(ans) = &node.default {
                return Some((ans, 0, NOERROR));
            }
            let zone = &self.zones[node.zone as usize];
            let apex_len = usize::from(self.nodes[zone.node as usize].len);
            return Some((&zone.negative, (qlen - apex_len) as u16, NOERROR));
        }
        // Not a name of the zones: its closest encloser decides (every ancestor of a name
        // up to its apex is a node, so the first one found is it).
        let suffixes = labels.iter().skip(1).map(|at| usize::from(*at)).chain([qlen - 1]);
        for at in suffixes {
            let Some(&i) = self.names.get(&qname[at..]) else {
                continue;
            };
            let node = &self.nodes[i as usize];
            if let Some(cut) = node.cut {
                let cut_node = &self.nodes[cut as usize];
                let referral = cut_node.referral.as_ref()?;
                return Some((referral, (qlen - usize::from(cut_node.len)) as u16, NOERROR));
            }
            let zone = &self.zones[node.zone as usize];
            let apex_len = usize::from(self.nodes[zone.node as usize].len);
            return Some((&zone.negative, (qlen - apex_len) as u16, NXDOMAIN));
        }
        None
    }

    /// One line per zone: its name, serial, record count and file.
    pub(crate) fn summary(&self) -> String {
        let mut s = String::new();
        for (i, z) in self.zones.iter().enumerate() {
            if i > 0 {
                s.push_str("; ");
            }
            let _ = write!(
                s,
                "{} (serial {}, {} records, {})",
                z.apex, z.serial, z.records, z.source
            );
        }
        s
    }
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// A zone to load: `FILE`, or `NAME=FILE` to give the origin of a file without `$ORIGIN`
/// (and to check that its SOA is there).
#[derive(Clone, Debug)]
pub(crate) struct ZoneSource {
    /// The zone's name, if given.
    pub(crate) origin: Option<Name>,
    /// The master file.
    pub(crate) path: PathBuf,
}

impl FromStr for ZoneSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty zone file name".into());
        }
        match s.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() && !name.contains('/') => {
                let mut origin = Name::from_str(name).map_err(|e| format!("zone name {name:?}: {e}"))?;
                origin.set_fqdn(true);
                Ok(ZoneSource {
                    origin: Some(origin),
                    path: path.into(),
                })
            }
            _ => Ok(ZoneSource {
                origin: None,
                path: s.into(),
            }),
        }
    }
}

impl Zones {
    /// Reads and parses every zone file, checks them, and precomputes their answers.
    /// `Err`: the first problem, prefixed with the file's name.
    pub(crate) fn load(sources: &[ZoneSource]) -> Result<Zones, String> {
        let mut texts = Vec::new();
        for s in sources {
            let text = std::fs::read_to_string(&s.path).map_err(|e| format!("{}: {e}", s.path.display()))?;
            texts.push((s.origin.clone(), text, s.path.display().to_string()));
        }
        Zones::from_texts(&texts)
    }

    /// As [`load`](Zones::load), from texts already read: `(origin, text, label)`, the
    /// label naming the zone in errors and in the summary.
    pub(crate) fn from_texts(texts: &[(Option<Name>, String, String)]) -> Result<Zones, String> {
        let mut parsed = Vec::new();
        for (origin, text, label) in texts {
            parsed.push(parse_zone(origin.clone(), text, label).map_err(|e| format!("{label}: {e}"))?);
        }
        build(parsed)
    }
}

/// The RRsets of one name, by type.
type Sets = BTreeMap<u16, Vec<Record>>;

/// A zone's names, by lowercase wire form: each as written, with its RRsets.
type Names = BTreeMap<Vec<u8>, (Name, Sets)>;

/// A zone as parsed: its apex, its SOA, and its RRsets by name.
struct Parsed {
    apex: Name,
    soa: Record,
    /// By lowercase wire name: the name as written, and its RRsets by type.
    names: Names,
    label: String,
    records: usize,
}

fn parse_zone(origin: Option<Name>, text: &str, label: &str) -> Result<Parsed, String> {
    let mut soa: Option<Record> = None;
    let mut names = Names::new();
    let mut records = 0;
    for (line, r) in read_master(text, origin.clone())? {
        if r.record_type() == RecordType::SOA
            && let Some(old) = soa.replace(r.clone())
        {
            return Err(format!(
                "line {line}: a second SOA record (the first is at {})",
                old.name()
            ));
        }
        if r.name().is_wildcard() {
            return Err(format!("line {line}: {}: wildcards are not supported", r.name()));
        }
        let entry = names
            .entry(wire_key(r.name()))
            .or_insert_with(|| (r.name().clone(), BTreeMap::new()));
        let set = entry.1.entry(u16::from(r.record_type())).or_default();
        // A record written twice is one record (RFC 2181 §5).
        if set.iter().any(|old| old.data() == r.data()) {
            continue;
        }
        if r.record_type() == RecordType::CNAME && !set.is_empty() {
            return Err(format!("line {line}: {}: a second CNAME record", r.name()));
        }
        set.push(r);
        records += 1;
    }
    let Some(soa) = soa else {
        return Err("no SOA record".into());
    };
    let apex = soa.name().clone();
    if let Some(origin) = &origin
        && *origin != apex
    {
        return Err(format!(
            "the SOA record is at {apex}, not at the zone's name {origin}"
        ));
    }
    for (name, sets) in names.values_mut() {
        if !apex.zone_of(name) {
            return Err(format!("{name}: out of the zone {apex}"));
        }
        if sets.contains_key(&T_CNAME) && sets.len() > 1 {
            return Err(format!("{name}: a CNAME and other data"));
        }
        // The records of an RRset share one TTL (RFC 2181 §5.2): the lowest written.
        for set in sets.values_mut() {
            let ttl = set.iter().map(Record::ttl).min().unwrap_or(0);
            for r in set.iter_mut() {
                r.set_ttl(ttl);
            }
        }
    }
    let soa = names[&wire_key(&apex)].1[&T_SOA][0].clone();
    Ok(Parsed {
        apex,
        soa,
        names,
        label: label.to_owned(),
        records,
    })
}

/// One token of a master file: its text (a quoted string unescaped, as hickory-proto's
/// record parsers expect it; other tokens as written, escapes kept for the name parser),
/// and whether it was quoted.
struct Token {
    text: String,
    quoted: bool,
}

/// One entry of a master file: a line, or lines joined by parentheses.
struct Entry {
    /// Its first line (from 1), for errors.
    line: usize,
    /// It starts with a blank: the owner is the previous entry's.
    blank: bool,
    tokens: Vec<Token>,
}

/// Splits a master file into entries (RFC 1035 §5.1): `;` comments, `( )` across lines,
/// quoted strings with `\X` and `\DDD` escapes, `\` escapes outside them kept as written.
fn entries(text: &str) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let mut entry = Entry {
        line: 1,
        blank: false,
        tokens: Vec::new(),
    };
    let mut depth = 0usize;
    let mut at_line_start = true;
    let mut word: Option<String> = None;
    let end_word = |word: &mut Option<String>, entry: &mut Entry| {
        if let Some(text) = word.take() {
            entry.tokens.push(Token { text, quoted: false });
        }
    };
    while let Some(c) = chars.next() {
        let line_start = std::mem::replace(&mut at_line_start, false);
        match c {
            '\n' => {
                end_word(&mut word, &mut entry);
                line += 1;
                at_line_start = true;
                if depth == 0 {
                    let next = Entry {
                        line,
                        blank: false,
                        tokens: Vec::new(),
                    };
                    let done = std::mem::replace(&mut entry, next);
                    if !done.tokens.is_empty() {
                        out.push(done);
                    }
                }
            }
            ';' => {
                end_word(&mut word, &mut entry);
                while chars.next_if(|c| *c != '\n').is_some() {}
            }
            '(' => {
                end_word(&mut word, &mut entry);
                depth += 1;
            }
            ')' => {
                end_word(&mut word, &mut entry);
                depth = depth
                    .checked_sub(1)
                    .ok_or(format!("line {line}: ')' without '('"))?;
            }
            '"' => {
                end_word(&mut word, &mut entry);
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(format!("line {line}: a quoted string is not closed")),
                        Some('"') => break,
                        Some('\\') => {
                            let digits: String = std::iter::from_fn(|| chars.next_if(char::is_ascii_digit))
                                .take(3)
                                .collect();
                            if digits.is_empty() {
                                match chars.next() {
                                    Some(c) => s.push(c),
                                    None => {
                                        return Err(format!("line {line}: a quoted string is not closed"));
                                    }
                                }
                            } else {
                                let n: u32 = digits.parse().unwrap_or(256);
                                if digits.len() != 3 || n > 255 {
                                    return Err(format!("line {line}: bad escape \\{digits}"));
                                }
                                s.push(char::from_u32(n).unwrap_or('?'));
                            }
                        }
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            s.push(c);
                        }
                    }
                }
                entry.tokens.push(Token {
                    text: s,
                    quoted: true,
                });
            }
            '\\' => {
                let w = word.get_or_insert_with(String::new);
                w.push('\\');
                if let Some(c) = chars.next_if(|c| *c != '\n') {
                    w.push(c);
                }
            }
            '\r' => end_word(&mut word, &mut entry),
            c if c.is_whitespace() => {
                if line_start && depth == 0 {
                    entry.blank = true;
                }
                end_word(&mut word, &mut entry);
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if depth > 0 {
        return Err(format!("line {line}: '(' not closed at the end of the file"));
    }
    end_word(&mut word, &mut entry);
    if !entry.tokens.is_empty() {
        out.push(entry);
    }
    Ok(out)
}

/// Reads the records of a master file, each with its line: the entries are the example's
/// (RFC 1035 §5 and RFC 2308's `$TTL`), each record's data, names and TTLs are parsed by
/// hickory-proto.
///
/// Not hickory-proto's own zone `Parser`: in 0.25 it gives the SOA record its expire
/// field as TTL, and a record's explicit TTL becomes the default of the records after it
/// even under `$TTL` (RFC 2308 §4: `$TTL` is the default), so a zone would be served with
/// other TTLs than BIND, NSD and Knot give it.
///
/// A record without a TTL gets `$TTL`'s; before any `$TTL`, the last TTL written (RFC
/// 1035), else the SOA's minimum (as BIND does). `$INCLUDE` is refused: a server that
/// reads the files its zones name is a risk for little gain.
fn read_master(text: &str, mut origin: Option<Name>) -> Result<Vec<(usize, Record)>, String> {
    let mut default_ttl: Option<u32> = None;
    let mut last_ttl: Option<u32> = None;
    let mut soa_minimum: Option<u32> = None;
    let mut owner: Option<Name> = None;
    let mut out = Vec::new();
    for e in entries(text)? {
        let line = e.line;
        let fail = |what: String| format!("line {line}: {what}");
        let name = |s: &str, origin: &Option<Name>| -> Result<Name, String> {
            if s == "@" {
                return origin.clone().ok_or_else(|| fail("@ without $ORIGIN".into()));
            }
            let n = Name::parse(s, origin.as_ref()).map_err(|err| fail(format!("name {s:?}: {err}")))?;
            if !n.is_fqdn() {
                return Err(fail(format!(
                    "{s}: a relative name without $ORIGIN (add one, or load the file as --zone NAME=FILE)"
                )));
            }
            Ok(n)
        };
        let first = &e.tokens[0];
        if !e.blank && !first.quoted && first.text.starts_with('$') {
            let arg = match e.tokens.get(1..) {
                Some([one]) => one.text.as_str(),
                _ => return Err(fail(format!("{} takes one value", first.text))),
            };
            match first.text.to_ascii_uppercase().as_str() {
                "$ORIGIN" => origin = Some(name(arg, &origin)?),
                "$TTL" => {
                    default_ttl = Some(Parser::parse_time(arg).map_err(|err| fail(format!("$TTL: {err}")))?)
                }
                "$INCLUDE" => return Err(fail("$INCLUDE is not supported".into())),
                other => return Err(fail(format!("unknown directive {other}"))),
            }
            continue;
        }
        let mut rest = &e.tokens[..];
        if !e.blank {
            owner = Some(name(&first.text, &origin)?);
            rest = &rest[1..];
        }
        let owner = owner.clone().ok_or_else(|| fail("no owner name".into()))?;
        let mut ttl = None;
        let rtype = loop {
            let Some((t, tail)) = rest.split_first() else {
                return Err(fail("no record type".into()));
            };
            rest = tail;
            let upper = t.text.to_ascii_uppercase();
            if t.text.starts_with(|c: char| c.is_ascii_digit())
                && let Ok(v) = Parser::parse_time(&t.text)
            {
                ttl = Some(v);
            } else if upper == "IN" {
            } else if DNSClass::from_str(&upper).is_ok() {
                return Err(fail(format!("class {upper}: only IN is served")));
            } else {
                break RecordType::from_str(&upper)
                    .map_err(|_| fail(format!("unknown record type {:?}", t.text)))?;
            }
        };
        let origin_text = origin.as_ref().map(Name::to_string);
        let tokens = rest
            .iter()
            .map(|t| match (&origin_text, t.quoted, t.text.as_str()) {
                (Some(o), false, "@") => o.as_str(),
                _ => t.text.as_str(),
            });
        let rdata =
            RData::parse(rtype, tokens, origin.as_ref()).map_err(|err| fail(format!("{rtype}: {err}")))?;
        // Without an origin, hickory-proto leaves a relative name in the data relative.
        let names: Vec<&Name> = match &rdata {
            RData::NS(n) => vec![&n.0],
            RData::CNAME(n) => vec![&n.0],
            RData::PTR(n) => vec![&n.0],
            RData::MX(mx) => vec![mx.exchange()],
            RData::SOA(soa) => vec![soa.mname(), soa.rname()],
            RData::SRV(srv) => vec![srv.target()],
            _ => vec![],
        };
        if let Some(n) = names.iter().find(|n| !n.is_fqdn()) {
            return Err(fail(format!(
                "{n}: a relative name without $ORIGIN (add one, or load the file as --zone NAME=FILE)"
            )));
        }
        if let RData::SOA(soa) = &rdata {
            soa_minimum = Some(soa.minimum());
        }
        let ttl = match ttl {
            Some(t) => {
                last_ttl = Some(t);
                t
            }
            None => default_ttl
                .or(last_ttl)
                .or(soa_minimum)
                .ok_or_else(|| fail("no TTL: give the record one, or put $TTL before it".into()))?,
        };
        let mut r = Record::from_rdata(owner, ttl, rdata);
        r.set_dns_class(DNSClass::IN);
        out.push((line, r));
    }
    Ok(out)
}

/// A name's lowercase wire form: the hash key.
fn wire_key(name: &Name) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        k.push(label.len() as u8);
        k.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    k.push(0);
    k
}

/// The wire key of the parent of a wire key (`None` for the root).
fn parent_key(key: &[u8]) -> Option<&[u8]> {
    let first = usize::from(*key.first()?);
    (first != 0).then(|| &key[1 + first..])
}

/// Puts the parsed zones together: one table of names (a name served by two zones
/// belongs to the deeper one), empty non-terminals, delegations, and every answer.
fn build(parsed: Vec<Parsed>) -> Result<Zones, String> {
    let mut apexes: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, z) in parsed.iter().enumerate() {
        if let Some(j) = apexes.insert(wire_key(&z.apex), i) {
            return Err(format!(
                "{}: the zone {} is also loaded from {}",
                z.label, z.apex, parsed[j].label
            ));
        }
    }
    // The zone a name belongs to: its deepest enclosing apex.
    let owner = |key: &[u8]| -> Option<usize> {
        let mut k = Some(key);
        while let Some(kk) = k {
            if let Some(&z) = apexes.get(kk) {
                return Some(z);
            }
            k = parent_key(kk);
        }
        None
    };
    // Every name (and every empty non-terminal up to its apex), in its zone.
    let mut table = Table::new();
    for (zi, z) in parsed.iter().enumerate() {
        for (key, (name, sets)) in &z.names {
            if owner(key) != Some(zi) {
                // Below the apex of a zone also served: that zone answers for it.
                continue;
            }
            table.insert(key.clone(), (zi, Some(name), Some(sets)));
            let mut k = parent_key(key);
            while let Some(kk) = k {
                if kk.len() < wire_key(&z.apex).len() {
                    break;
                }
                table.entry(kk.to_vec()).or_insert((zi, None, None));
                k = parent_key(kk);
            }
        }
    }
    let index: HashMap<&[u8], u32> = table
        .keys()
        .enumerate()
        .map(|(i, k)| (k.as_slice(), i as u32))
        .collect();
    let sets_of = |key: &[u8]| table.get(key).and_then(|(_, _, s)| *s);
    // The cut each name is at or below: the highest non-apex ancestor-or-self with NS.
    let cut_of = |key: &[u8], zi: usize| -> Option<u32> {
        let apex_len = wire_key(&parsed[zi].apex).len();
        let mut found = None;
        let mut k = Some(key);
        while let Some(kk) = k {
            if kk.len() <= apex_len {
                break;
            }
            if sets_of(kk).is_some_and(|s| s.contains_key(&T_NS)) {
                found = Some(index[kk]);
            }
            k = parent_key(kk);
        }
        found
    };
    let ctx = Ctx {
        table: &table,
        cut_of: &cut_of,
    };
    let mut nodes = Vec::with_capacity(table.len());
    for (key, (zi, name, sets)) in &table {
        let z = &parsed[*zi];
        let name = name.cloned().unwrap_or_else(|| name_of(key));
        let cut = cut_of(key, *zi);
        let mut node = Node {
            zone: *zi as u32,
            len: key.len() as u8,
            cut,
            answers: Vec::new(),
            default: None,
            referral: None,
        };
        if let Some(sets) = sets {
            if cut == Some(index[key.as_slice()]) {
                node.referral = Some(ctx.referral(&name, &sets[&T_NS], *zi)?);
            }
            if cut.is_none() {
                ctx.answers(&mut node, &name, key, sets, z, *zi)?;
            }
        }
        nodes.push(node);
    }
    let mut zones = Vec::new();
    for z in &parsed {
        let mut b = Builder::new(&z.apex);
        let RData::SOA(soa) = z.soa.data() else {
            unreachable!()
        };
        b.record(1, &z.soa, Some(z.soa.ttl().min(soa.minimum())))?;
        zones.push(Zone {
            node: index[wire_key(&z.apex).as_slice()],
            negative: b.finish(AA),
            apex: z.apex.clone(),
            source: z.label.clone(),
            records: z.records,
            serial: soa.serial(),
        });
    }
    let mut names = HashMap::with_capacity_and_hasher(table.len(), BuildHasherDefault::<FxHasher>::default());
    for (i, key) in table.keys().enumerate() {
        names.insert(key.clone().into_boxed_slice(), i as u32);
    }
    Ok(Zones { names, nodes, zones })
}

/// A name from its wire key (for empty non-terminals, which the file never writes).
fn name_of(key: &[u8]) -> Name {
    let mut labels = Vec::new();
    let mut at = 0;
    while key[at] != 0 {
        let len = usize::from(key[at]);
        labels.push(key[at + 1..at + 1 + len].to_vec());
        at += 1 + len;
    }
    let mut n = Name::from_labels(labels).expect("a name from a valid key");
    n.set_fqdn(true);
    n
}

/// Every name of every zone: its zone, and (unless an empty non-terminal) its name as
/// written and its RRsets.
type Table<'a> = BTreeMap<Vec<u8>, (usize, Option<&'a Name>, Option<&'a Sets>)>;

/// What building answers needs to look names up.
struct Ctx<'a, 'b> {
    table: &'b Table<'a>,
    cut_of: &'b dyn Fn(&[u8], usize) -> Option<u32>,
}

/// Where a CNAME chain ends.
enum ChainEnd<'a> {
    /// At a name of the zone with these RRsets (`None`: an empty non-terminal).
    Node(Option<&'a Sets>),
    /// At a name the zone does not have: NXDOMAIN.
    Missing,
    /// Out of the zone, below a delegation, in a loop or past [`MAX_CHAIN`]: the chain is
    /// the answer, NOERROR.
    Elsewhere,
}

impl<'a> Ctx<'a, '_> {
    /// The zone's authoritative RRsets at `key`, if it is a name of zone `zi` above any cut.
    fn auth(&self, key: &[u8], zi: usize) -> Option<Option<&'a Sets>> {
        let (z, _, sets) = self.table.get(key)?;
        (*z == zi && (self.cut_of)(key, zi).is_none()).then_some(*sets)
    }

    /// The address records of `targets` the zone has (authoritative or glue), for the
    /// additional section.
    fn addresses(&self, targets: &[&Name], zi: usize) -> Vec<&'a Record> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for t in targets {
            let key = wire_key(t);
            if !seen.insert(key.clone()) {
                continue;
            }
            if let Some((z, _, Some(sets))) = self.table.get(&key)
                && *z == zi
            {
                for ty in [T_A, T_AAAA] {
                    out.extend(sets.get(&ty).into_iter().flatten());
                }
            }
        }
        out
    }

    /// The additional records for an RRset: the addresses of MX exchanges and of name
    /// servers.
    fn additional(&self, set: &[Record], zi: usize) -> Vec<&'a Record> {
        let targets: Vec<&Name> = set
            .iter()
            .filter_map(|r| match r.data() {
                RData::MX(mx) => Some(mx.exchange()),
                RData::NS(ns) => Some(&ns.0),
                _ => None,
            })
            .collect();
        self.addresses(&targets, zi)
    }

    fn referral(&self, cut: &Name, ns: &[Record], zi: usize) -> Result<Answer, String> {
        let mut b = Builder::new(cut);
        for r in ns {
            b.record(1, r, None)?;
        }
        for r in self.additional(ns, zi) {
            b.record(2, r, None)?;
        }
        // The glue is part of a referral: without it the resolver may not reach the child
        // (RFC 9471), so an answer it does not fit in is truncated.
        let mut referral = b.finish(0);
        referral.required = referral.bytes.len();
        Ok(referral)
    }

    /// Fills a node's answers: each type's RRset (with its additional records), ANY, and
    /// for a CNAME the chain followed inside the zone.
    fn answers(
        &self,
        node: &mut Node,
        name: &Name,
        key: &[u8],
        sets: &'a Sets,
        z: &Parsed,
        zi: usize,
    ) -> Result<(), String> {
        if let Some(cname) = sets.get(&T_CNAME) {
            let mut b = Builder::new(name);
            b.record(0, &cname[0], None)?;
            let alone = b.finish(AA);
            node.answers.push((T_CNAME, alone.clone()));
            node.answers.push((T_ANY, alone));
            // Follow the chain.
            let mut chain = vec![&cname[0]];
            let mut seen = HashSet::from([key.to_vec()]);
            let end = loop {
                let RData::CNAME(target) = chain[chain.len() - 1].data() else {
                    unreachable!()
                };
                let tkey = wire_key(&target.0);
                if !z.apex.zone_of(&target.0) || !seen.insert(tkey.clone()) {
                    break ChainEnd::Elsewhere;
                }
                match self.auth(&tkey, zi) {
                    None if self.table.contains_key(&tkey) => break ChainEnd::Elsewhere,
                    None => {
                        // Not a name of the zones: NXDOMAIN, unless it is below a cut or
                        // in a zone of its own.
                        let mut k = parent_key(&tkey);
                        let mut end = ChainEnd::Missing;
                        while let Some(kk) = k {
                            if let Some((zz, _, _)) = self.table.get(kk) {
                                if *zz != zi || (self.cut_of)(kk, zi).is_some() {
                                    end = ChainEnd::Elsewhere;
                                }
                                break;
                            }
                            k = parent_key(kk);
                        }
                        break end;
                    }
                    Some(None) => break ChainEnd::Node(None),
                    Some(Some(tsets)) => match tsets.get(&T_CNAME) {
                        Some(next) if chain.len() < MAX_CHAIN => chain.push(&next[0]),
                        Some(_) => break ChainEnd::Elsewhere,
                        None => break ChainEnd::Node(Some(tsets)),
                    },
                }
            };
            let with_chain = |tail: &dyn Fn(&mut Builder) -> Result<(), String>, rcode: u16| {
                let mut b = Builder::new(name);
                for r in &chain {
                    b.record(0, r, None)?;
                }
                tail(&mut b)?;
                Ok::<Answer, String>(b.finish(AA | rcode))
            };
            let negative = |b: &mut Builder| {
                let RData::SOA(soa) = z.soa.data() else {
                    unreachable!()
                };
                b.record(1, &z.soa, Some(z.soa.ttl().min(soa.minimum())))
            };
            node.default = Some(match end {
                ChainEnd::Node(tsets) => {
                    for (ty, set) in tsets.into_iter().flatten() {
                        let set = set.as_slice();
                        let ans = with_chain(
                            &|b| {
                                for r in set {
                                    b.record(0, r, None)?;
                                }
                                for r in self.additional(set, zi) {
                                    b.record(2, r, None)?;
                                }
                                Ok(())
                            },
                            NOERROR,
                        )?;
                        node.answers.push((*ty, ans));
                    }
                    with_chain(&negative, NOERROR)?
                }
                ChainEnd::Missing => with_chain(&negative, NXDOMAIN)?,
                ChainEnd::Elsewhere => with_chain(&|_| Ok(()), NOERROR)?,
            });
            node.answers.sort_by_key(|(t, _)| *t);
            return Ok(());
        }
        let mut any = Builder::new(name);
        for (ty, set) in sets {
            let mut b = Builder::new(name);
            for r in set {
                b.record(0, r, None)?;
                any.record(0, r, None)?;
            }
            for r in self.additional(set, zi) {
                b.record(2, r, None)?;
            }
            node.answers.push((*ty, b.finish(AA)));
        }
        if !sets.is_empty() {
            node.answers.push((T_ANY, any.finish(AA)));
        }
        node.answers.sort_by_key(|(t, _)| *t);
        Ok(())
    }
}

/// Writes one precomputed answer: a message whose question holds the node's name, with
/// compression, recording where each pointer is.
struct Builder {
    buf: Vec<u8>,
    /// Where the question ends: the answer's bytes start there.
    start: usize,
    /// The offset of each name suffix written so far, by lowercase wire form.
    names: HashMap<Vec<u8>, u16>,
    pointers: Vec<u16>,
    counts: [u16; 3],
    /// The section being written (0 answer, 1 authority, 2 additional).
    section: usize,
    required: Option<usize>,
}

impl Builder {
    fn new(qname: &Name) -> Builder {
        let mut b = Builder {
            buf: vec![0; HEADER],
            start: 0,
            names: HashMap::new(),
            pointers: Vec::new(),
            counts: [0; 3],
            section: 0,
            required: None,
        };
        b.name(qname);
        b.buf.extend_from_slice(&[0; 4]);
        b.start = b.buf.len();
        b.pointers.clear();
        b
    }

    /// Writes `name`, as a pointer to an earlier copy of its longest suffix written.
    fn name(&mut self, name: &Name) {
        let labels: Vec<&[u8]> = name.iter().collect();
        for i in 0..labels.len() {
            let mut suffix = Vec::new();
            for l in &labels[i..] {
                suffix.push(l.len() as u8);
                suffix.extend(l.iter().map(u8::to_ascii_lowercase));
            }
            suffix.push(0);
            if let Some(&at) = self.names.get(&suffix) {
                self.pointers.push((self.buf.len() - self.start) as u16);
                self.buf.extend_from_slice(&(0xc000 | at).to_be_bytes());
                return;
            }
            let here = self.buf.len();
            if here <= MAX_POINTER_TARGET {
                self.names.insert(suffix, here as u16);
            }
            self.buf.push(labels[i].len() as u8);
            self.buf.extend_from_slice(labels[i]);
        }
        self.buf.push(0);
    }

    /// Appends `r` to `section` (0 answer, 1 authority, 2 additional), in order.
    fn record(&mut self, section: usize, r: &Record, ttl: Option<u32>) -> Result<(), String> {
        debug_assert!(section >= self.section);
        if section == 2 && self.required.is_none() {
            self.required = Some(self.buf.len() - self.start);
        }
        self.section = section;
        self.name(r.name());
        self.buf
            .extend_from_slice(&u16::from(r.record_type()).to_be_bytes());
        self.buf.extend_from_slice(&CLASS_IN.to_be_bytes());
        self.buf.extend_from_slice(&ttl.unwrap_or(r.ttl()).to_be_bytes());
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        match r.data() {
            // The types of RFC 1035 whose names may be compressed (RFC 3597 §4).
            RData::NS(n) => self.name(&n.0),
            RData::CNAME(n) => self.name(&n.0),
            RData::PTR(n) => self.name(&n.0),
            RData::MX(mx) => {
                self.buf.extend_from_slice(&mx.preference().to_be_bytes());
                self.name(mx.exchange());
            }
            RData::SOA(soa) => {
                self.name(soa.mname());
                self.name(soa.rname());
                for v in [
                    soa.serial(),
                    soa.refresh() as u32,
                    soa.retry() as u32,
                    soa.expire() as u32,
                    soa.minimum(),
                ] {
                    self.buf.extend_from_slice(&v.to_be_bytes());
                }
            }
            // Every other type through hickory-proto, without compression.
            other => {
                let mut rdata = Vec::new();
                let mut enc = BinEncoder::new(&mut rdata);
                enc.set_canonical_names(true);
                other
                    .emit(&mut enc)
                    .map_err(|e| format!("{} {}: {e}", r.name(), r.record_type()))?;
                self.buf.extend_from_slice(&rdata);
            }
        }
        let rdlen = self.buf.len() - len_at - 2;
        let rdlen = u16::try_from(rdlen)
            .map_err(|_| format!("{} {}: record data too long", r.name(), r.record_type()))?;
        self.buf[len_at..len_at + 2].copy_from_slice(&rdlen.to_be_bytes());
        self.counts[section] += 1;
        if self.buf.len() > usize::from(u16::MAX) {
            return Err(format!("{}: an answer longer than 65535 bytes", r.name()));
        }
        Ok(())
    }

    fn finish(self, flags: u16) -> Answer {
        let bytes = self.buf[self.start..].to_vec().into_boxed_slice();
        Answer {
            flags,
            counts: self.counts,
            required: self.required.unwrap_or(bytes.len()),
            bytes,
            pointers: self.pointers.into_boxed_slice(),
        }
    }
}

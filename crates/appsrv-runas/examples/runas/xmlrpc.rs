//! The `runas` example's XML-RPC: the reader of a `<methodCall>` (quick-xml's events,
//! flattened, then a recursive-descent parser that accepts only the subset of XML-RPC a
//! call is made of), the writer of a `<methodResponse>`, and the faults, with their codes.
//!
//! It knows nothing of the policy, the helper or appsrv: bytes in, values or a fault out,
//! and back. Its limits bound what a client can make a worker do before the policy is
//! even asked: no DTD (so no entity expansion and no external file), at most
//! `MAX_TOKENS` elements and texts, values nested at most `MAX_DEPTH` deep, and UTF-8
//! only; the body's size is the HTTP codec's limit (`MAX_BODY`, in `worker.rs`).

use std::fmt::Write as _;

use quick_xml::events::Event;
use serde::{Deserialize, Serialize};

/// The most XML elements and texts a request may have.
const MAX_TOKENS: usize = 4096;
/// The deepest nesting of XML-RPC values.
const MAX_DEPTH: usize = 8;

/// An XML-RPC value. Types the method never takes are kept by name only, for the message.
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Array(Vec<Value>),
    Struct(Vec<(String, Value)>),
    Other(&'static str),
}

impl Value {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Int(_) => "int",
            Value::Bool(_) => "boolean",
            Value::Array(_) => "array",
            Value::Struct(_) => "struct",
            Value::Other(t) => t,
        }
    }
}

/// A fault: XML-RPC's error reply (also the helper's refusal, as it travels back).
#[derive(Serialize, Deserialize)]
pub(crate) struct Fault {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl Fault {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Fault {
        Fault {
            code,
            message: message.into(),
        }
    }
}

pub(crate) const FAULT_AUTH: i32 = 1;
pub(crate) const FAULT_COMMAND: i32 = 2;
pub(crate) const FAULT_USER: i32 = 3;
pub(crate) const FAULT_ARGUMENT: i32 = 4;
pub(crate) const FAULT_EXEC: i32 = 5;
const FAULT_PARSE: i32 = -32700;
const FAULT_REQUEST: i32 = -32600;
pub(crate) const FAULT_METHOD: i32 = -32601;
pub(crate) const FAULT_PARAMS: i32 = -32602;

/// The XML of a request, flattened: elements become `Open`/`Close` (an empty element
/// both), text is unescaped and merged.
#[derive(PartialEq)]
enum Tok {
    Open(String),
    Close(String),
    Text(String),
}

fn tokenize(xml: &str) -> Result<Vec<Tok>, String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut toks = Vec::new();
    fn text(toks: &mut Vec<Tok>, s: &str) {
        match toks.last_mut() {
            Some(Tok::Text(t)) => t.push_str(s),
            _ => toks.push(Tok::Text(s.to_owned())),
        }
    }
    let name =
        |n: &[u8]| String::from_utf8(n.to_vec()).map_err(|_| "an element name is not UTF-8".to_owned());
    loop {
        let event = reader.read_event().map_err(|e| {
            format!(
                "not well-formed XML (near byte {}): {e}",
                reader.buffer_position()
            )
        })?;
        match event {
            Event::Start(e) => toks.push(Tok::Open(name(e.name().as_ref())?)),
            Event::Empty(e) => {
                let n = name(e.name().as_ref())?;
                toks.push(Tok::Open(n.clone()));
                toks.push(Tok::Close(n));
            }
            Event::End(e) => toks.push(Tok::Close(name(e.name().as_ref())?)),
            Event::Text(t) => text(&mut toks, &t.xml10_content().map_err(|e| e.to_string())?),
            Event::CData(t) => text(&mut toks, &t.xml10_content().map_err(|e| e.to_string())?),
            Event::GeneralRef(r) => {
                let c = match r.resolve_char_ref().map_err(|e| e.to_string())? {
                    Some(c) => c.to_string(),
                    None => {
                        let entity = r.decode().map_err(|e| e.to_string())?;
                        quick_xml::escape::resolve_xml_entity(&entity)
                            .ok_or_else(|| format!("unknown entity &{entity};"))?
                            .to_owned()
                    }
                };
                text(&mut toks, &c);
            }
            Event::Decl(d) => {
                if let Some(Ok(enc)) = d.encoding() {
                    if !enc.eq_ignore_ascii_case(b"utf-8") && !enc.eq_ignore_ascii_case(b"us-ascii") {
                        return Err(format!(
                            "encoding {:?}: only UTF-8 is accepted",
                            String::from_utf8_lossy(&enc)
                        ));
                    }
                }
            }
            // No DTD at all: no entity definitions, no expansion bombs, no external files.
            Event::DocType(_) => return Err("a DOCTYPE is not allowed".into()),
            Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
        if toks.len() > MAX_TOKENS {
            return Err(format!("more than {MAX_TOKENS} elements"));
        }
    }
    Ok(toks)
}

/// A recursive-descent reader of the flattened request.
struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    /// Skips a text made only of white space (between elements).
    fn skip_space(&mut self) {
        if let Some(Tok::Text(t)) = self.peek() {
            if t.trim().is_empty() {
                self.pos += 1;
            }
        }
    }

    fn open(&mut self, name: &str) -> Result<(), String> {
        self.skip_space();
        match self.peek() {
            Some(Tok::Open(n)) if n == name => {
                self.pos += 1;
                Ok(())
            }
            other => Err(format!("expected <{name}>, found {}", describe(other))),
        }
    }

    fn close(&mut self, name: &str) -> Result<(), String> {
        self.skip_space();
        match self.peek() {
            Some(Tok::Close(n)) if n == name => {
                self.pos += 1;
                Ok(())
            }
            other => Err(format!("expected </{name}>, found {}", describe(other))),
        }
    }

    fn at_close(&mut self, name: &str) -> bool {
        self.skip_space();
        matches!(self.peek(), Some(Tok::Close(n)) if n == name)
    }

    /// The text up to `</name>` (empty if there is none).
    fn text(&mut self, name: &str) -> Result<String, String> {
        let s = match self.peek() {
            Some(Tok::Text(t)) => {
                let t = t.clone();
                self.pos += 1;
                t
            }
            _ => String::new(),
        };
        self.close(name)?;
        Ok(s)
    }

    /// `<methodCall>`: the method name and the parameters.
    fn call(&mut self) -> Result<(String, Vec<Value>), String> {
        self.open("methodCall")?;
        self.open("methodName")?;
        let method = self.text("methodName")?.trim().to_owned();
        let mut params = Vec::new();
        self.skip_space();
        if let Some(Tok::Open(n)) = self.peek() {
            if n == "params" {
                self.open("params")?;
                while !self.at_close("params") {
                    self.open("param")?;
                    params.push(self.value(0)?);
                    self.close("param")?;
                }
                self.close("params")?;
            }
        }
        self.close("methodCall")?;
        self.skip_space();
        if self.pos != self.toks.len() {
            return Err(format!(
                "unexpected {} after </methodCall>",
                describe(self.peek())
            ));
        }
        Ok((method, params))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("values nested deeper than {MAX_DEPTH}"));
        }
        self.open("value")?;
        // A value without a type element is a string, white space included.
        if let Some(Tok::Text(t)) = self.peek() {
            if matches!(self.toks.get(self.pos + 1), Some(Tok::Close(n)) if n == "value") {
                let s = t.clone();
                self.pos += 2;
                return Ok(Value::Str(s));
            }
        }
        if let Some(Tok::Close(n)) = self.peek() {
            if n == "value" {
                self.pos += 1;
                return Ok(Value::Str(String::new()));
            }
        }
        self.skip_space();
        let kind = match self.peek() {
            Some(Tok::Open(n)) => n.clone(),
            other => return Err(format!("expected a value type, found {}", describe(other))),
        };
        self.pos += 1;
        let value = match kind.as_str() {
            "string" => Value::Str(self.text("string")?),
            "int" | "i4" | "i8" => {
                let t = self.text(&kind)?;
                Value::Int(
                    t.trim()
                        .parse()
                        .map_err(|_| format!("<{kind}>{t}</{kind}>: not an integer"))?,
                )
            }
            "boolean" => match self.text("boolean")?.trim() {
                "0" => Value::Bool(false),
                "1" => Value::Bool(true),
                t => return Err(format!("<boolean>{t}</boolean>: expected 0 or 1")),
            },
            "array" => {
                self.open("data")?;
                let mut items = Vec::new();
                while !self.at_close("data") {
                    items.push(self.value(depth + 1)?);
                }
                self.close("data")?;
                self.close("array")?;
                Value::Array(items)
            }
            "struct" => {
                let mut members = Vec::new();
                while !self.at_close("struct") {
                    self.open("member")?;
                    self.open("name")?;
                    let name = self.text("name")?;
                    members.push((name, self.value(depth + 1)?));
                    self.close("member")?;
                }
                self.close("struct")?;
                Value::Struct(members)
            }
            "double" | "base64" | "dateTime.iso8601" | "nil" => {
                let name = match kind.as_str() {
                    "double" => "double",
                    "base64" => "base64",
                    "nil" => "nil",
                    _ => "dateTime.iso8601",
                };
                self.text(&kind)?;
                Value::Other(name)
            }
            other => return Err(format!("unknown value type <{other}>")),
        };
        self.close("value")?;
        Ok(value)
    }
}

fn describe(tok: Option<&Tok>) -> String {
    match tok {
        Some(Tok::Open(n)) => format!("<{n}>"),
        Some(Tok::Close(n)) => format!("</{n}>"),
        Some(Tok::Text(t)) => format!("text {:?}", t.chars().take(32).collect::<String>()),
        None => "the end of the document".into(),
    }
}

/// Parses a `<methodCall>`: faults for what is not XML, and for XML that is not a call.
pub(crate) fn parse_call(body: &[u8]) -> Result<(String, Vec<Value>), Fault> {
    let xml = std::str::from_utf8(body)
        .map_err(|_| Fault::new(FAULT_PARSE, "parse error: the body is not UTF-8"))?;
    let toks = tokenize(xml).map_err(|e| Fault::new(FAULT_PARSE, format!("parse error: {e}")))?;
    if !toks.iter().any(|t| matches!(t, Tok::Open(_))) {
        return Err(Fault::new(FAULT_PARSE, "parse error: no XML element in the body"));
    }
    Parser { toks, pos: 0 }
        .call()
        .map_err(|e| Fault::new(FAULT_REQUEST, format!("invalid request: {e}")))
}

/// Appends `s` as XML character data: escaped, and with every character XML 1.0 cannot
/// carry (control characters other than tab, line feed and carriage return; U+FFFE and
/// U+FFFF) replaced by U+FFFD. A carriage return is written as a reference so that it
/// survives the reader's line-end normalisation.
fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            '\t' | '\n' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}

fn value_xml(out: &mut String, v: &Value) {
    out.push_str("<value>");
    match v {
        Value::Str(s) => {
            out.push_str("<string>");
            escape_into(out, s);
            out.push_str("</string>");
        }
        Value::Int(i) => {
            let _ = write!(out, "<int>{i}</int>");
        }
        Value::Bool(b) => {
            let _ = write!(out, "<boolean>{}</boolean>", *b as u8);
        }
        Value::Array(items) => {
            out.push_str("<array><data>");
            for item in items {
                value_xml(out, item);
            }
            out.push_str("</data></array>");
        }
        Value::Struct(members) => {
            out.push_str("<struct>");
            for (name, value) in members {
                out.push_str("<member><name>");
                escape_into(out, name);
                out.push_str("</name>");
                value_xml(out, value);
                out.push_str("</member>");
            }
            out.push_str("</struct>");
        }
        Value::Other(_) => out.push_str("<nil/>"),
    }
    out.push_str("</value>");
}

pub(crate) fn response_xml(result: &Result<Value, Fault>) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<methodResponse>");
    match result {
        Ok(v) => {
            out.push_str("<params><param>");
            value_xml(&mut out, v);
            out.push_str("</param></params>");
        }
        Err(f) => {
            out.push_str("<fault>");
            let fault = Value::Struct(vec![
                ("faultCode".into(), Value::Int(f.code.into())),
                ("faultString".into(), Value::Str(f.message.clone())),
            ]);
            value_xml(&mut out, &fault);
            out.push_str("</fault>");
        }
    }
    out.push_str("</methodResponse>\n");
    out
}

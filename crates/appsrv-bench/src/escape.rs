//! The escapes of `--request` and `--until`: `\r \n \t \\ \0 \xHH`.
//!
//! Every other byte stands for itself (UTF-8 text is sent as its bytes). A backslash
//! followed by anything else, a lone backslash at the end, or `\x` without two hex
//! digits is an error, so that a typo is reported rather than sent.

/// Turns `text` with escapes into the bytes it stands for.
pub(crate) fn unescape(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&e) = bytes.get(i + 1) else {
            return Err("a lone \\ ends the text (write \\\\ for a backslash)".to_string());
        };
        i += 2;
        match e {
            b'r' => out.push(b'\r'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'\\' => out.push(b'\\'),
            b'0' => out.push(0),
            b'x' => {
                let hex = bytes.get(i..i + 2).unwrap_or(&bytes[i..]);
                match (hex.first().and_then(hex_digit), hex.get(1).and_then(hex_digit)) {
                    (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                    _ => {
                        let shown: String = text[i..].chars().take(2).collect();
                        return Err(format!("\\x must be followed by two hex digits, not {shown:?}"));
                    }
                }
                i += 2;
            }
            _ => {
                // `i - 1` is a char boundary: the backslash before it is one byte.
                let c = text[i - 1..].chars().next().unwrap_or('?');
                return Err(format!(
                    "unknown escape \\{c} (the escapes are \\r \\n \\t \\\\ \\0 \\xHH)"
                ));
            }
        }
    }
    Ok(out)
}

fn hex_digit(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(unescape("ping").unwrap(), b"ping");
        assert_eq!(unescape("").unwrap(), b"");
        assert_eq!(unescape("héllo").unwrap(), "héllo".as_bytes());
    }

    #[test]
    fn each_escape() {
        assert_eq!(unescape(r"\r").unwrap(), b"\r");
        assert_eq!(unescape(r"\n").unwrap(), b"\n");
        assert_eq!(unescape(r"\t").unwrap(), b"\t");
        assert_eq!(unescape(r"\\").unwrap(), b"\\");
        assert_eq!(unescape(r"\0").unwrap(), b"\0");
        assert_eq!(unescape(r"\x41").unwrap(), b"A");
        assert_eq!(unescape(r"\xff\x00\xAb").unwrap(), [0xff, 0x00, 0xab]);
    }

    #[test]
    fn escapes_mixed_with_text() {
        assert_eq!(unescape(r"ping\n").unwrap(), b"ping\n");
        assert_eq!(
            unescape(r"GET / HTTP/1.0\r\n\r\n").unwrap(),
            b"GET / HTTP/1.0\r\n\r\n"
        );
        assert_eq!(unescape(r"a\\nb").unwrap(), b"a\\nb");
        assert_eq!(unescape(r"\x410").unwrap(), b"A0");
        assert_eq!(unescape(r"é\té").unwrap(), "é\té".as_bytes());
    }

    #[test]
    fn errors() {
        assert!(unescape("\\").unwrap_err().contains("lone"));
        assert!(unescape("abc\\").unwrap_err().contains("lone"));
        assert!(unescape(r"\q").unwrap_err().contains("unknown escape \\q"));
        assert!(unescape(r"\é").unwrap_err().contains("unknown escape \\é"));
        assert!(unescape(r"\x").unwrap_err().contains("two hex digits"));
        assert!(unescape(r"\x4").unwrap_err().contains("two hex digits"));
        assert!(unescape(r"\x4g").unwrap_err().contains("two hex digits"));
        assert!(unescape(r"\xé1").unwrap_err().contains("two hex digits"));
        assert!(unescape(r"\1").unwrap_err().contains("unknown escape"));
    }
}

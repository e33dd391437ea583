//! Reading the library's own source for the tests of its structural rules (issue 43):
//! a token stream that skips comments and literals, the functions with their lengths, and
//! the `.rs` files under a folder. The counting is `bench/fn-lengths.py`'s, ported so that
//! no test needs python: the same tokens, the same brace matching, the same lengths.

#![allow(dead_code)] // each test binary uses a different part of this module
#![allow(unreachable_pub)] // shared by several test crates through `mod source`

use std::path::{Path, PathBuf};

/// A token of Rust source: an identifier or keyword, or punctuation (`::` is one token,
/// any other character one of its own). Comments, string, byte-string, raw-string and
/// char literals yield nothing; numbers come out as punctuation, digit by digit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Whether the token is an identifier (or keyword).
    pub ident: bool,
    /// Its text.
    pub text: String,
    /// The line it is on, from 1.
    pub line: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The length of a char literal's body and closing quote at `s[start..]` (`x'`, `\n'`,
/// `\u{1F600}'`), or `None` when the quote opens a lifetime or a label: the python
/// script's `(\\u\{[0-9a-fA-F_]*\}|\\.|[^\\'\n])'`, looked for in the next 12 characters.
fn char_literal(s: &[char], start: usize) -> Option<usize> {
    let window = &s[start..s.len().min(start + 12)];
    let at = |i: usize| window.get(i).copied();
    if at(0) == Some('\\') {
        if at(1) == Some('u') && at(2) == Some('{') {
            let mut i = 3;
            while at(i).is_some_and(|c| c.is_ascii_hexdigit() || c == '_') {
                i += 1;
            }
            if at(i) == Some('}') && at(i + 1) == Some('\'') {
                return Some(i + 2);
            }
        }
        // `\\.`: any character but a newline after the backslash.
        return match (at(1), at(2)) {
            (Some(c), Some('\'')) if c != '\n' => Some(3),
            _ => None,
        };
    }
    match (at(0), at(1)) {
        (Some(c), Some('\'')) if c != '\'' && c != '\n' => Some(2),
        _ => None,
    }
}

/// The opening of a raw string at `s[i..]` (`r"`, `r#"`, `br##"`): its length and the
/// number of `#`, looked for in the next 260 characters as the script does.
fn raw_string_opening(s: &[char], i: usize) -> Option<(usize, usize)> {
    let window = &s[i..s.len().min(i + 260)];
    let mut k = match window {
        ['b', 'r', ..] => 2,
        ['r', ..] => 1,
        _ => return None,
    };
    let hashes_from = k;
    while window.get(k) == Some(&'#') {
        k += 1;
    }
    (window.get(k) == Some(&'"')).then_some((k + 1, k - hashes_from))
}

fn find(s: &[char], from: usize, needle: &[char]) -> Option<usize> {
    (from..=s.len().saturating_sub(needle.len())).find(|&j| s[j..].starts_with(needle))
}

/// The tokens of `src`, as `bench/fn-lengths.py`'s `tokens` reads them (it keeps only
/// identifiers and `{}()[];`, as [`functions`] does; the other punctuation is for paths).
pub fn tokens(src: &str) -> Vec<Token> {
    let s: Vec<char> = src.chars().collect();
    let n = s.len();
    let (mut i, mut line) = (0, 1);
    let mut out = Vec::new();
    let count_lines = |from: usize, to: usize| s[from..to.min(n)].iter().filter(|&&c| c == '\n').count();
    while i < n {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if s[i..].starts_with(&['/', '/']) {
            i = find(&s, i, &['\n']).unwrap_or(n);
        } else if s[i..].starts_with(&['/', '*']) {
            let mut depth = 1;
            i += 2;
            while i < n && depth > 0 {
                if s[i..].starts_with(&['/', '*']) {
                    depth += 1;
                    i += 2;
                } else if s[i..].starts_with(&['*', '/']) {
                    depth -= 1;
                    i += 2;
                } else {
                    line += usize::from(s[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some((open, hashes)) = raw_string_opening(&s, i) {
            let mut end = vec!['"'];
            end.extend(std::iter::repeat_n('#', hashes));
            let j = find(&s, i + open, &end).map_or(n, |j| j + end.len());
            line += count_lines(i, j);
            i = j;
        } else if c == '"' || s[i..].starts_with(&['b', '"']) {
            i += if c == '"' { 1 } else { 2 };
            while i < n && s[i] != '"' {
                if s[i] == '\\' {
                    i += 1;
                }
                line += usize::from(s.get(i) == Some(&'\n'));
                i += 1;
            }
            i += 1;
        } else if c == '\'' || s[i..].starts_with(&['b', '\'']) {
            let start = i + if c == '\'' { 1 } else { 2 };
            match char_literal(&s, start) {
                Some(len) => i = start + len,
                None => i += 1,
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < n && is_ident_char(s[i]) {
                i += 1;
            }
            out.push(Token {
                ident: true,
                text: s[start..i].iter().collect(),
                line,
            });
        } else if s[i..].starts_with(&[':', ':']) {
            out.push(Token {
                ident: false,
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Token {
                    ident: false,
                    text: c.into(),
                    line,
                });
            }
            i += 1;
        }
    }
    out
}

/// A function with a body: its name and the lines of its `fn` keyword and of its closing
/// brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The line of its `fn` keyword.
    pub first: usize,
    /// The line of its closing brace.
    pub last: usize,
}

impl Function {
    /// Its length in lines, both ends included (a one-line function is 1).
    pub fn lines(&self) -> usize {
        self.last - self.first + 1
    }
}

/// Every function of `src` that has a body, nested ones included (each listed on its own
/// and counted in the one that contains it), as `bench/fn-lengths.py`'s `functions`.
pub fn functions(src: &str) -> Vec<Function> {
    // The script's tokens only: `fn $name` in a macro is a function named `name` to it.
    let toks: Vec<Token> = tokens(src)
        .into_iter()
        .filter(|t| t.ident || matches!(t.text.as_str(), "{" | "}" | "(" | ")" | "[" | "]" | ";"))
        .collect();
    let mut found = Vec::new();
    for (k, tok) in toks.iter().enumerate() {
        if !tok.ident || tok.text != "fn" {
            continue;
        }
        let Some(name) = toks.get(k + 1).filter(|t| t.ident) else {
            continue; // `fn(u8) -> u8`, a pointer type
        };
        // The body is the first `{` outside parentheses and brackets (`-> [u8; 29] {`); a
        // `;` first means no body.
        let (mut parens, mut j) = (0i32, k + 2);
        while j < toks.len() {
            match toks[j].text.as_str() {
                "(" | "[" => parens += 1,
                ")" | "]" => parens -= 1,
                "{" | ";" if parens == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if j >= toks.len() || toks[j].text == ";" {
            continue;
        }
        let mut depth = 0;
        while j < toks.len() {
            match toks[j].text.as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        found.push(Function {
            name: name.text.clone(),
            first: tok.line,
            last: toks[j.min(toks.len() - 1)].line,
        });
    }
    found
}

/// The library's source folder, `crates/appsrv/src`.
pub fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// `file`'s path relative to `src/`, with `/` between its parts (`worker/event.rs`).
pub fn relative(src: &Path, file: &Path) -> String {
    file.strip_prefix(src)
        .unwrap()
        .components()
        .map(|c| c.as_os_str().to_str().unwrap())
        .collect::<Vec<_>>()
        .join("/")
}

//! The structural rules of the developers' guide, checked on the library's source (issue
//! 43): no function over 100 lines, and `unsafe` outside `sys/` only where
//! docs/ARCHITECTURE.md lists it, with its `// SAFETY:` comment. The source is read with
//! `tests/source/`, the port of `bench/fn-lengths.py`, so comments and strings never count.

use std::collections::BTreeMap;
use std::path::Path;

mod source;

/// The longest a function may be, in lines from its `fn` to its closing brace.
const MAX_LINES: usize = 100;

/// Functions allowed to be longer, as (file or folder under `src/`, name). Only clap's
/// definitions: a list of arguments, each with its help, reads best as one builder chain,
/// and cutting it would only scatter the command line's description.
const LONG_ALLOWED: &[(&str, &str)] = &[("cli", "serve_args")];

/// Whether `rel` (`cli.rs`, `cli/args.rs`) is the file or folder `allowed` names.
fn is_in(rel: &str, allowed: &str) -> bool {
    rel == format!("{allowed}.rs") || rel == allowed || rel.starts_with(&format!("{allowed}/"))
}

/// Issue 43: no function in `crates/appsrv/src` is over 100 lines (clap's definitions
/// aside); each one that is is named with its length and place, longest first.
#[test]
fn issue_43_no_function_is_over_100_lines() {
    let src = source::src_dir();
    let mut long = Vec::new();
    let mut allowed_seen = vec![false; LONG_ALLOWED.len()];
    for file in source::rust_files(&src) {
        let rel = source::relative(&src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        for f in source::functions(&text) {
            let allowed = LONG_ALLOWED
                .iter()
                .position(|(at, name)| is_in(&rel, at) && f.name == *name);
            if let Some(i) = allowed {
                allowed_seen[i] = true;
            } else if f.lines() > MAX_LINES {
                long.push((f.lines(), format!("{rel}:{} {}", f.first, f.name)));
            }
        }
    }
    long.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let listing: Vec<String> = long.iter().map(|(n, at)| format!("{n:5} {at}")).collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines (bench/fn-lengths.py counts the same):\n{}",
        listing.join("\n")
    );
    for (seen, (at, name)) in allowed_seen.iter().zip(LONG_ALLOWED) {
        assert!(
            seen,
            "{at}'s {name} is allowed to be long but is gone: drop it from the list"
        );
    }
}

/// The counting agrees with `bench/fn-lengths.py` where a brace could mislead it: inside
/// strings, raw strings, byte and char literals, nested comments; a lifetime is no char;
/// a declaration without a body and a `fn` pointer type are no function. (The script,
/// run on the tree of this commit, lists the same functions with the same lengths.)
#[test]
fn issue_43_functions_are_measured_as_the_script_does() {
    let text = r####"
fn one() {}
/// A doc comment with a brace {
fn strings<'a>(x: &'a str) -> [u8; 2] {
    let _ = "{ \" {";
    let _ = r#"{ "# ;
    let _ = br##"{"#"##;
    let _ = b"{";
    let _ = ('{', b'}', '\'', '\u{7B}');
    /* { /* nested { */ } */
    'label: loop { break 'label; }
    [0, 1]
}
trait T {
    fn declared(&self);
}
fn pointer(f: fn(u8) -> u8) -> u8 {
    fn nested() {
    }
    f(1)
}
"####;
    let found: Vec<(String, usize, usize)> = source::functions(text)
        .into_iter()
        .map(|f| (f.name.clone(), f.first, f.lines()))
        .collect();
    let expected = [
        ("one", 2, 1),
        ("strings", 4, 10),
        ("pointer", 17, 5),
        ("nested", 18, 2),
    ]
    .map(|(n, l, c)| (n.to_owned(), l, c));
    assert_eq!(found, expected);
}

/// The kinds of `unsafe` the code has, for one place (a function or a type).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Unsafe {
    /// `unsafe { ... }` blocks.
    blocks: usize,
    /// `unsafe impl`s.
    impls: usize,
}

/// The `unsafe` blocks and `unsafe impl`s of `text` (file `rel` of `src/`), by place:
/// `rel (function)` for a block (the innermost function around it), `rel (type)` for an
/// impl; and, separately, every other `unsafe` (a declaration: `unsafe fn`, `unsafe
/// trait`, `unsafe extern`) and every block without its `// SAFETY:` comment.
fn unsafe_of(rel: &str, text: &str) -> (BTreeMap<String, Unsafe>, Vec<String>, Vec<String>) {
    let tokens = source::tokens(text);
    let functions = source::functions(text);
    let lines: Vec<&str> = text.lines().collect();
    let (mut places, mut other, mut unexplained) = (BTreeMap::new(), Vec::new(), Vec::new());
    for (k, t) in tokens.iter().enumerate() {
        if !t.ident || t.text != "unsafe" {
            continue;
        }
        match tokens.get(k + 1).map(|n| n.text.as_str()) {
            Some("{") => {
                let around = functions
                    .iter()
                    .filter(|f| f.first <= t.line && t.line <= f.last)
                    .min_by_key(|f| f.lines())
                    .map_or("(no function)", |f| f.name.as_str());
                let entry: &mut Unsafe = places.entry(format!("{rel} ({around})")).or_default();
                entry.blocks += 1;
                if !has_safety_comment(&lines, t.line) {
                    unexplained.push(format!("{rel}:{} in {around}", t.line));
                }
            }
            Some("impl") => {
                // `unsafe impl Trait for Type`: the type is after `for`.
                let ty = tokens[k..]
                    .iter()
                    .take_while(|t| t.text != "{" && t.text != ";")
                    .skip_while(|t| t.text != "for")
                    .nth(1)
                    .map_or("?", |t| t.text.as_str());
                let entry: &mut Unsafe = places.entry(format!("{rel} ({ty})")).or_default();
                entry.impls += 1;
            }
            next => other.push(format!("{rel}:{}: unsafe {}", t.line, next.unwrap_or(""))),
        }
    }
    (places, other, unexplained)
}

/// Whether the `unsafe` block on line `line` (from 1) has a `// SAFETY:` comment: on its
/// line, or in the comment lines just above the statement it is in (the lines above that
/// continue the same statement, `let x =`, are passed over).
fn has_safety_comment(lines: &[&str], line: usize) -> bool {
    if lines[line - 1].contains("// SAFETY:") {
        return true;
    }
    for l in lines[..line - 1].iter().rev() {
        let l = l.trim();
        if l.starts_with("//") {
            if l.contains("SAFETY:") {
                return true;
            }
            continue;
        }
        if l.is_empty() || l.ends_with(';') || l.ends_with('{') || l.ends_with('}') {
            return false;
        }
    }
    false
}

/// The places the tables under "`unsafe` outside `sys/`" in docs/ARCHITECTURE.md list:
/// "`file` (`function`)" rows of the blocks' table, "`file` (`type`)" rows of the impls'
/// table, `×2` for two at one place.
fn documented_unsafe() -> BTreeMap<String, Unsafe> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text
        .split("### `unsafe` outside `sys/`")
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a section \"`unsafe` outside `sys/`\"");
    let section = section.split("\n## ").next().unwrap();
    let mut places: BTreeMap<String, Unsafe> = BTreeMap::new();
    let mut impls = None;
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let first = line.split('|').nth(1).unwrap_or("").trim();
        match first {
            "File (function)" => impls = Some(false),
            "File (type)" => impls = Some(true),
            _ if first.starts_with("---") => {}
            _ => {
                let names: Vec<&str> = first.split('`').skip(1).step_by(2).collect();
                let [file, place] = names[..] else {
                    panic!("a row of the unsafe tables is not \"`file` (`place`)\": {line}");
                };
                let times = first
                    .split('×')
                    .nth(1)
                    .map_or(1, |n| n.trim().parse().expect("a count after ×"));
                let entry = places.entry(format!("{file} ({place})")).or_default();
                match impls.expect("a row before a table's header") {
                    false => entry.blocks += times,
                    true => entry.impls += times,
                }
            }
        }
    }
    assert!(!places.is_empty(), "the unsafe tables were not found");
    places
}

/// Issue 43: outside `sys/`, `unsafe` is what docs/ARCHITECTURE.md lists, place by place
/// ("`unsafe` outside `sys/`"), at most ten blocks, and nothing else (no `unsafe fn`);
/// and every `unsafe` block of `src/`, `sys/` included, has its `// SAFETY:` comment.
#[test]
fn issue_43_unsafe_outside_sys_is_what_the_doc_lists() {
    let src = source::src_dir();
    let (mut actual, mut other, mut unexplained) = (BTreeMap::new(), Vec::new(), Vec::new());
    for file in source::rust_files(&src) {
        let rel = source::relative(&src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        let (places, others, missing) = unsafe_of(&rel, &text);
        unexplained.extend(missing);
        if rel.starts_with("sys/") {
            continue;
        }
        actual.extend(places);
        other.extend(others);
    }
    let documented = documented_unsafe();
    let blocks: usize = actual.values().map(|u: &Unsafe| u.blocks).sum();
    let listed: usize = documented.values().map(|u| u.blocks).sum();
    let mut wrong = Vec::new();
    for place in actual.keys().chain(documented.keys()) {
        let (a, d) = (actual.get(place), documented.get(place));
        if a != d && !wrong.iter().any(|w: &String| w.starts_with(place.as_str())) {
            let a = a.copied().unwrap_or_default();
            let d = d.copied().unwrap_or_default();
            wrong.push(format!(
                "{place}: {} block(s) and {} impl(s) in the code, {} and {} in the doc",
                a.blocks, a.impls, d.blocks, d.impls
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "`unsafe` outside sys/ ({blocks} blocks) differs from docs/ARCHITECTURE.md's tables ({listed}):\n{}",
        wrong.join("\n")
    );
    assert!(blocks <= 10, "{blocks} unsafe blocks outside sys/: at most 10");
    assert!(
        other.is_empty(),
        "unsafe declarations outside sys/:\n{}",
        other.join("\n")
    );
    assert!(
        unexplained.is_empty(),
        "unsafe blocks without a `// SAFETY:` comment:\n{}",
        unexplained.join("\n")
    );
}

/// The unsafe scan sees blocks by function, impls by type, declarations, and a block
/// whose comment is missing, and skips comments and strings.
#[test]
fn issue_43_unsafe_is_found_where_it_is() {
    let text = r#"
// unsafe { in a comment }
fn f() {
    let _ = "unsafe { in a string }";
    // SAFETY: explained.
    let x =
        unsafe { g() };
    let y = unsafe { g() };
}
// SAFETY: all zeroes.
unsafe impl Shared for Board {}
unsafe fn g() {}
"#;
    let (places, other, unexplained) = unsafe_of("a.rs", text);
    assert_eq!(places.get("a.rs (f)"), Some(&Unsafe { blocks: 2, impls: 0 }));
    assert_eq!(places.get("a.rs (Board)"), Some(&Unsafe { blocks: 0, impls: 1 }));
    assert_eq!(places.len(), 2);
    assert_eq!(other, ["a.rs:12: unsafe fn"]);
    assert_eq!(unexplained, ["a.rs:8 in f"]);
}

/// Names that only `sys/` may use: `fork(2)` and its kin, and turning a descriptor number
/// into an owned or borrowed descriptor ("Fork rules" in docs/ARCHITECTURE.md).
const SYS_ONLY: &[&str] = &["fork", "vfork", "from_raw_fd", "borrow_raw", "FromRawFd"];

/// Issue 43: `sys/` is the one module that calls `fork(2)` and the one that makes an
/// `OwnedFd` or a `BorrowedFd` (or a socket, a file) from a descriptor number, as
/// ARCHITECTURE says: outside it, each such name in code is named with its place.
/// (`sys::fork`, a call of the module's own function, is allowed.)
#[test]
fn issue_43_fork_and_descriptor_numbers_belong_to_sys() {
    let src = source::src_dir();
    let mut wrong = Vec::new();
    for file in source::rust_files(&src) {
        let rel = source::relative(&src, &file);
        if rel.starts_with("sys/") {
            continue;
        }
        let tokens = source::tokens(&std::fs::read_to_string(&file).unwrap());
        for (k, t) in tokens.iter().enumerate() {
            if !t.ident || !SYS_ONLY.contains(&t.text.as_str()) {
                continue;
            }
            // `sys::fork()` is the module's own function; a method or a field named so
            // (`x.fork`) is not the system call either.
            let before = |n: usize| k.checked_sub(n).map(|i| tokens[i].text.as_str());
            if before(1) == Some(".") || (before(1) == Some("::") && before(2) == Some("sys")) {
                continue;
            }
            if t.text.ends_with("fork") && before(1) != Some("::") {
                continue; // a bare `fork`: a name of ours, not a path to the call
            }
            wrong.push(format!("{rel}:{}: {}", t.line, t.text));
        }
    }
    assert!(
        wrong.is_empty(),
        "outside sys/, fork or a descriptor made from a number:\n{}",
        wrong.join("\n")
    );
}

//! The source tree's layering (issue 15): every `crate::` path in `src/` must name a group
//! that the code map in `docs/ARCHITECTURE.md` allows its group to use, the map itself has
//! no cycle, and every group in `src/` is in the map. A new dependency that breaks the
//! layering fails here, with the file and the path.
//!
//! Issue 32 made it tell the whole truth: a name the crate root re-exports (`crate::Io` is
//! `cli::Io`, `crate::listener` is `net::listener`) counts as a use of the group that
//! defines it (it was skipped, so `worker` → `cli` went unseen); and inside a folder the
//! files may not form a cycle either (`super::x` and `crate::folder::x` between its files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The code map: group → groups it may use, read from the table in the architecture doc.
fn code_map() -> BTreeMap<String, BTreeSet<String>> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text
        .split("## Code map")
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a \"## Code map\" section");
    let mut map = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", group, owns, may use, ""]
        if cells.len() < 5 || cells[1] == "Group" || cells[1].starts_with("---") {
            continue;
        }
        let group = cells[1].trim_matches('`').trim_end_matches('/').to_owned();
        let uses: BTreeSet<String> = if cells[3] == "every group" {
            ["*".to_owned()].into()
        } else {
            cells[3]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|g| g.trim_end_matches('/').to_owned())
                .collect()
        };
        map.insert(group, uses);
    }
    assert!(map.len() > 5, "the code map table was not found: {map:?}");
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The group a source file belongs to: its folder under `src/`, or its own name.
fn group_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// The names the crate root re-exports (`pub use cli::Io;`, `pub use net::{listener,
/// tls};`), each with the group that defines it; a re-export of a re-export
/// (`pub use listener::{Addr, ListenAddr};`) is followed to its group.
fn root_exports(src: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut direct = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let head = rest.split("::").next().unwrap_or("").to_owned();
        if !rest.contains("::") {
            continue; // an external crate (`pub use clap;`)
        }
        let tail = rest.rsplit("::").next().unwrap_or("");
        let names: Vec<&str> = match rest.find('{') {
            Some(at) => rest[at + 1..].trim_end_matches('}').split(',').collect(),
            None => vec![tail],
        };
        for name in names {
            let name = name.trim().rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() {
                direct.insert(name.to_owned(), head.clone());
            }
        }
    }
    let mut resolved = BTreeMap::new();
    for (name, mut group) in direct.clone() {
        // `listener` → `net`: follow re-exports of re-exports (a chain is short).
        for _ in 0..4 {
            match direct.get(&group) {
                Some(next) if *next != group => group = next.clone(),
                _ => break,
            }
        }
        resolved.insert(name, group);
    }
    resolved
}

/// Every `crate::x` path in code (comments skipped), with its line number, as (line, x,
/// the rest of the path).
fn crate_paths(text: &str) -> Vec<(usize, String, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split("//").next().unwrap_or(code);
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let path: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let head = path.split("::").next().unwrap_or("").to_owned();
            found.push((n + 1, head, path.clone()));
            rest = &after[path.len()..];
        }
    }
    found
}

#[test]
fn the_code_map_has_no_cycle() {
    let map = code_map();
    // Depth-first search for a back edge.
    fn visit<'a>(
        g: &'a str,
        map: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(g) {
            return;
        }
        assert!(!path.contains(&g), "cycle in the code map: {path:?} -> {g}");
        path.push(g);
        for u in map.get(g).into_iter().flatten() {
            if u != "*" {
                visit(u, map, path, done);
            }
        }
        path.pop();
        done.insert(g);
    }
    let mut done = BTreeSet::new();
    for g in map.keys() {
        visit(g, &map, &mut Vec::new(), &mut done);
    }
    for (g, uses) in &map {
        for u in uses {
            assert!(
                u == "*" || map.contains_key(u),
                "{g} may use {u}, which is not in the map"
            );
        }
    }
}

#[test]
fn every_crate_path_follows_the_code_map() {
    let map = code_map();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let exports = root_exports(&src);
    let mut wrong = Vec::new();
    for file in &files {
        let group = group_of(&src, file);
        let Some(allowed) = map.get(&group) else {
            wrong.push(format!(
                "{}: group {group} is not in the code map",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, head, path) in crate_paths(&text) {
            // Re-exports at the root (`crate::Server`, `crate::Io`, `crate::listener`)
            // are uses of the group that defines them.
            let head = match exports.get(&head) {
                Some(g) => g.clone(),
                None if head.starts_with(char::is_uppercase) => {
                    wrong.push(format!(
                        "{}:{line}: crate::{path} is no re-export of the crate root this test can resolve",
                        file.display()
                    ));
                    continue;
                }
                None => head,
            };
            if head == group || allowed.contains("*") {
                continue;
            }
            if !allowed.contains(&head) {
                wrong.push(format!(
                    "{}:{line}: {group} uses crate::{path}, but may use only {allowed:?}",
                    file.display()
                ));
            }
            // The master drives workers through the worker's interface only.
            if group == "master"
                && (path.starts_with("worker::blocking") || path.starts_with("worker::serve"))
            {
                wrong.push(format!(
                    "{}:{line}: the master imports a connection driver's type: crate::{path}",
                    file.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

/// The modules a file of a folder uses among its siblings: `super::x` (from a file other
/// than the folder's `mod.rs`), `self::x` (from `mod.rs`) and `crate::folder::x`, braces
/// included (`use super::{a, b::C}`). Names that are no sibling file (an item of `mod.rs`,
/// a test module's `super::*`) are left out by the caller.
fn sibling_uses(folder: &str, is_mod_rs: bool, text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let own = format!("crate::{folder}::");
    let prefixes: Vec<&str> = if is_mod_rs {
        vec!["self::", own.as_str()]
    } else {
        vec!["super::", own.as_str()]
    };
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split("//").next().unwrap_or(code);
        for prefix in &prefixes {
            for (at, _) in code.match_indices(prefix) {
                let before = &code[..at];
                let rest = &code[at + prefix.len()..];
                // `super::super::x` is the crate root's, and `a_super::` no path of ours.
                if before.ends_with("::")
                    || before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
                    || rest.starts_with("super::")
                {
                    continue;
                }
                if let Some(list) = rest.strip_prefix('{') {
                    let inner = list.split('}').next().unwrap_or("");
                    for item in inner.split(',') {
                        let head = item.trim().split("::").next().unwrap_or("").trim();
                        found.insert(head.to_owned());
                    }
                } else {
                    let head: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    found.insert(head);
                }
            }
        }
    }
    found
}

/// Issue 32: the files inside each folder of `src/` use each other without a cycle (a
/// cycle among a folder's files hid behind the folder-level map: worker/ had blocking →
/// serve → event → blocking).
#[test]
fn the_files_of_each_folder_have_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let folder = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let graph = folder_graph(&folder, true);
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{folder}/: {}", cycle.join(" -> ")));
        }
        for sub in std::fs::read_dir(&dir).unwrap() {
            let sub = sub.unwrap().path();
            if sub.is_dir() {
                let sub = format!("{folder}/{}", sub.file_name().unwrap().to_str().unwrap());
                if let Some(cycle) = find_cycle(&folder_graph(&sub, true)) {
                    cycles.push(format!("{sub}/: {}", cycle.join(" -> ")));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "module cycles inside folders:\n{}",
        cycles.join("\n")
    );
}

/// The file graph of folder `folder` of `src/`: each file → the files of the folder it
/// uses; `mod.rs` (the folder's root, which names its files to declare them) only
/// `with_root`.
fn folder_graph(folder: &str, with_root: bool) -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(folder);
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    let names: BTreeSet<String> = files
        .iter()
        .map(|p| p.file_stem().unwrap().to_str().unwrap().to_owned())
        .filter(|n| n != "mod")
        .collect();
    // A subfolder (`worker/event/`) is one node of its folder's graph: what its files use
    // of the folder's files, together (its own files' graph is checked on its own).
    let subfolders: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    let names: BTreeSet<String> = names
        .into_iter()
        .chain(
            subfolders
                .iter()
                .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned()),
        )
        .collect();
    let mut graph = BTreeMap::new();
    for sub in &subfolders {
        let name = sub.file_name().unwrap().to_str().unwrap().to_owned();
        let uses = subfolder_uses(folder, sub)
            .into_iter()
            .filter(|u| names.contains(u) && *u != name)
            .collect();
        graph.insert(name, uses);
    }
    for file in &files {
        let name = file.file_stem().unwrap().to_str().unwrap().to_owned();
        if name == "mod" && !with_root {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let uses = sibling_uses(folder, name == "mod", &text)
            .into_iter()
            .filter(|u| names.contains(u) && *u != name)
            .collect();
        graph.insert(name, uses);
    }
    graph
}

/// What the files of subfolder `sub` of `folder` use among `folder`'s files: `super::x`
/// from its `mod.rs`, `super::super::x` from its other files, `crate::folder::x` from any.
fn subfolder_uses(folder: &str, sub: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(sub).unwrap() {
        let file = entry.unwrap().path();
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let text = if file.file_stem().is_some_and(|s| s == "mod") {
            text
        } else {
            // The subfolder's own siblings (`super::x`) are not the folder's files.
            text.replace("super::super::", "\u{0}")
                .replace("super::", "sub::")
                .replace('\u{0}', "super::")
        };
        found.extend(sibling_uses(folder, false, &text));
    }
    found
}

/// The file map of `worker/` in docs/ARCHITECTURE.md: the text block after "Inside
/// `worker/`", one line per file (or several files, comma-separated) with what it uses
/// after an arrow, `(none)` for nothing.
fn documented_worker_map() -> BTreeMap<String, BTreeSet<String>> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text
        .split("Inside `worker/` the files")
        .nth(1)
        .expect("docs/ARCHITECTURE.md maps the files of worker/");
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the worker/ file map is a text block");
    let mut map = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (files, uses) = line.split_once("->").expect("file -> uses");
        let uses: BTreeSet<String> = uses
            .split_whitespace()
            .filter(|u| *u != "(none)")
            .map(str::to_owned)
            .collect();
        for file in files.split(',') {
            map.insert(file.trim().to_owned(), uses.clone());
        }
    }
    map
}

/// Issue 32: the files of `worker/` use each other as its map in docs/ARCHITECTURE.md
/// says, no more and no less: the map is checked, not only the absence of a cycle.
#[test]
fn the_files_of_worker_follow_their_map() {
    let actual = folder_graph("worker", false);
    let documented = documented_worker_map();
    let render = |g: &BTreeMap<String, BTreeSet<String>>| {
        g.iter()
            .map(|(f, u)| {
                let uses: Vec<&str> = u.iter().map(String::as_str).collect();
                format!(
                    "{f} -> {}",
                    if uses.is_empty() {
                        "(none)".into()
                    } else {
                        uses.join(" ")
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        render(&actual),
        render(&documented),
        "worker/'s files and their map in docs/ARCHITECTURE.md differ; the files use:\n{}",
        render(&actual)
    );
}

/// A cycle of `graph`, if it has one, as the path that closes it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if done.contains(node) {
            return None;
        }
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The test's own parsing: a re-export of a re-export resolves, and a cycle is found.
#[test]
fn the_checks_see_what_they_must() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exports = root_exports(&src);
    assert_eq!(exports.get("Io").map(String::as_str), Some("cli"));
    assert_eq!(exports.get("Addr").map(String::as_str), Some("net"));
    assert_eq!(exports.get("tls").map(String::as_str), Some("net"));
    let uses = sibling_uses(
        "worker",
        false,
        "use super::{access::AccessLog, guard};\nlet x = crate::worker::serve::f();\nuse super::super::cli;",
    );
    assert_eq!(uses, ["access", "guard", "serve"].map(String::from).into());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), ["b".to_owned()].into()),
        ("b".to_owned(), ["c".to_owned()].into()),
        ("c".to_owned(), ["a".to_owned()].into()),
    ]
    .into();
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(4));
}

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
use std::path::Path;

mod source;

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
    let files = source::rust_files(&src);
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

/// The module path of a file of `src/`: `worker/event.rs` is `[worker, event]`,
/// `worker/mod.rs` is `[worker]`, `lib.rs` is `[]`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Every path of `tokens` that starts at `crate`, `self` or `super` (comments and strings
/// are no tokens), as the module path it names from the crate root, for code in `module`:
/// `super::x` in `worker/event.rs` is `[worker, x]`. A list is expanded, nested lists and
/// lines included (`use super::{a, b::{C, D}}` is `a`, `b::C` and `b::D`); `self` in a list
/// is the list's own path. An inline module's `super::` is read as the file's (a test
/// module's `super::*` names no file).
fn module_paths(tokens: &[source::Token], module: &[String]) -> Vec<Vec<String>> {
    /// The leaves of the path or list at `toks[*k..]`, each after `prefix`.
    fn tree(toks: &[source::Token], k: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        while let Some(t) = toks.get(*k) {
            if t.text == "{" {
                *k += 1;
                loop {
                    match toks.get(*k).map(|t| t.text.as_str()) {
                        None => return,
                        Some("}") => {
                            *k += 1;
                            return;
                        }
                        Some(",") => *k += 1,
                        Some(_) => {
                            let at = *k;
                            tree(toks, k, path.clone(), out);
                            if *k == at {
                                *k += 1; // no path: not ours to read
                            }
                        }
                    }
                }
            }
            if t.ident || t.text == "*" {
                if t.text != "self" || path.is_empty() {
                    path.push(t.text.clone());
                }
                *k += 1;
                if toks.get(*k).is_some_and(|t| t.text == "::") {
                    *k += 1;
                    continue;
                }
            }
            break;
        }
        // A renaming (`as name`) names nothing more.
        if toks.get(*k).is_some_and(|t| t.text == "as") {
            *k += 2;
        }
        out.push(path);
    }
    let mut found = Vec::new();
    for (k, t) in tokens.iter().enumerate() {
        let starts = t.ident
            && matches!(t.text.as_str(), "crate" | "self" | "super")
            && tokens.get(k + 1).is_some_and(|n| n.text == "::")
            && (k == 0 || tokens[k - 1].text != "::");
        if !starts {
            continue;
        }
        let mut leaves = Vec::new();
        tree(tokens, &mut k.clone(), Vec::new(), &mut leaves);
        for leaf in leaves {
            let mut base: Vec<String> = Vec::new();
            let mut rest = leaf.as_slice();
            match rest.first().map(String::as_str) {
                Some("crate") => rest = &rest[1..],
                Some("self") => {
                    base = module.to_vec();
                    rest = &rest[1..];
                }
                _ => {
                    let ups = rest.iter().take_while(|s| *s == "super").count();
                    if ups > module.len() {
                        continue;
                    }
                    base = module[..module.len() - ups].to_vec();
                    rest = &rest[ups..];
                }
            }
            base.extend(rest.iter().cloned());
            found.push(base);
        }
    }
    found
}

/// The paths that the intra-doc links of `text` name with `crate::`, `super::` or
/// `self::` (`[`Store`](crate::net::tls::Store)`, `[`super::page::X`]`, `[x]: self::y`),
/// written as code, one per line. rustdoc resolves them, so a file's docs use the file
/// they link to as much as its code does (issue 43: `conn/transport.rs`'s docs linked
/// the client, whose code uses the transport).
fn doc_links(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        let Some(doc) = line.strip_prefix("///").or_else(|| line.strip_prefix("//!")) else {
            continue;
        };
        let mut starts: Vec<usize> = ["crate::", "super::", "self::"]
            .iter()
            .flat_map(|prefix| doc.match_indices(prefix).map(|(at, _)| at))
            .collect();
        starts.sort_unstable();
        for at in starts {
            let before = doc[..at].trim_end_matches('`');
            if !(before.ends_with('(') || before.ends_with('[') || before.ends_with("]: ")) {
                continue;
            }
            let path: String = doc[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push_str(path.trim_end_matches(':'));
            out.push_str(";\n");
        }
    }
    out
}

/// The folders of `src/`, nested ones included, as paths relative to it (`worker`,
/// `worker/tasks`).
fn folders() -> Vec<String> {
    let src = source::src_dir();
    let mut out = BTreeSet::new();
    for file in source::rust_files(&src) {
        let rel = source::relative(&src, &file);
        let mut parts: Vec<&str> = rel.split('/').collect();
        parts.pop();
        for depth in 1..=parts.len() {
            out.insert(parts[..depth].join("/"));
        }
    }
    out.into_iter().collect()
}

/// The file graph of folder `folder` of `src/` (`worker`, `worker/tasks`): each of its
/// files (a file's stem; a folder inside it counts as one file, named after it) → the
/// others it uses, through `super::`, `self::` or `crate::` paths; `mod.rs` (the folder's
/// root, which names its files to declare them, and whose items are not counted) only
/// `with_root`.
fn folder_graph(folder: &str, with_root: bool) -> BTreeMap<String, BTreeSet<String>> {
    let src = source::src_dir();
    let own: Vec<String> = folder.split('/').map(str::to_owned).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in source::rust_files(&src.join(folder)) {
        let rel = source::relative(&src, &file);
        let module = module_of(&rel);
        // The node of the file: its own name, the sub-folder it is in, or `mod`.
        let node = match module.get(own.len()) {
            Some(n) => n.clone(),
            None if with_root => "mod".to_owned(),
            None => continue,
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let uses = graph.entry(node.clone()).or_default();
        let mut tokens = source::tokens(&text);
        tokens.extend(source::tokens(&doc_links(&text)));
        for path in module_paths(&tokens, &module) {
            if path.len() > own.len() && path[..own.len()] == own[..] && path[own.len()] != node {
                uses.insert(path[own.len()].clone());
            }
        }
    }
    // Only what is a file (or a folder) of this one: an item of `mod.rs` is not.
    let nodes: BTreeSet<String> = graph.keys().cloned().collect();
    let mut names = nodes.clone();
    for entry in std::fs::read_dir(src.join(folder)).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            names.insert(path.file_name().unwrap().to_str().unwrap().to_owned());
        }
    }
    for uses in graph.values_mut() {
        uses.retain(|u| names.contains(u) && u != "mod");
    }
    graph
}

/// Issue 32: the files inside each folder of `src/` use each other without a cycle (a
/// cycle among a folder's files hid behind the folder-level map: worker/ had blocking →
/// serve → event → blocking). Issue 43: every folder, nested ones too, and every cycle of
/// a folder is named, not only the first.
#[test]
fn the_files_of_each_folder_have_no_cycle() {
    let mut cycles = Vec::new();
    for folder in folders() {
        let mut graph = folder_graph(&folder, true);
        // Each cycle found is reported and one of its edges set aside, to find the others.
        while let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{folder}/: {}", cycle.join(" -> ")));
            graph
                .get_mut(&cycle[cycle.len() - 2])
                .unwrap()
                .remove(&cycle[cycle.len() - 1]);
        }
    }
    assert!(
        cycles.is_empty(),
        "module cycles inside folders:\n{}",
        cycles.join("\n")
    );
}

/// The file map of `folder` in docs/ARCHITECTURE.md: the text block after "Inside
/// `folder/` the files", one line per file (or several files, comma-separated) with what
/// it uses after an arrow, `(none)` for nothing; `None` if the doc has no such map.
fn documented_map(folder: &str) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text.split(&format!("Inside `{folder}/` the files")).nth(1)?;
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a folder's file map is a text block");
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
    Some(map)
}

/// A file graph as its map in the doc writes it, one line per file.
fn render(graph: &BTreeMap<String, BTreeSet<String>>) -> String {
    graph
        .iter()
        .map(|(f, u)| {
            let uses: Vec<&str> = u.iter().map(String::as_str).collect();
            let uses = if uses.is_empty() {
                "(none)".to_owned()
            } else {
                uses.join(" ")
            };
            format!("{f} -> {uses}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 32: the files of `worker/` use each other as its map in docs/ARCHITECTURE.md
/// says, no more and no less: the map is checked, not only the absence of a cycle. Issue
/// 43: so do the files of every folder of `src/`, and the map lists every file of its
/// folder (a file it leaves out, or one that is gone, is named).
#[test]
fn the_files_of_every_folder_follow_their_map() {
    let mut wrong = Vec::new();
    for folder in folders() {
        let actual = folder_graph(&folder, false);
        let Some(documented) = documented_map(&folder) else {
            wrong.push(format!(
                "{folder}/ has no file map in docs/ARCHITECTURE.md (\"Inside `{folder}/` the files\"); its files use:\n{}",
                render(&actual)
            ));
            continue;
        };
        let missing: Vec<&String> = actual.keys().filter(|f| !documented.contains_key(*f)).collect();
        let gone: Vec<&String> = documented.keys().filter(|f| !actual.contains_key(*f)).collect();
        if !missing.is_empty() {
            wrong.push(format!("{folder}/'s file map does not list {missing:?}"));
        }
        if !gone.is_empty() {
            wrong.push(format!("{folder}/'s file map lists {gone:?}, no file of it"));
        }
        if render(&actual) != render(&documented) {
            wrong.push(format!(
                "{folder}/'s files and their map in docs/ARCHITECTURE.md differ; the files use:\n{}\nthe map says:\n{}",
                render(&actual),
                render(&documented)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
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
    let module = module_of("worker/event.rs");
    assert_eq!(module, ["worker", "event"]);
    let text = "use super::{access::AccessLog, guard};\nlet x = crate::worker::serve::f();\n\
        use super::super::cli; // super::nothing\nlet s = \"crate::nothing\";\n\
        use super::{\n    budget::{self, Budget as B},\n    ledger::{Ledger, Trouble},\n};\n\
        pub(super) fn f() {}\nuse crate::worker::tasks::{clients::C, requests};";
    let paths: BTreeSet<String> = module_paths(&source::tokens(text), &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let expected = [
        "worker::access::AccessLog",
        "worker::guard",
        "worker::serve::f",
        "cli",
        "worker::budget",
        "worker::budget::Budget",
        "worker::ledger::Ledger",
        "worker::ledger::Trouble",
        "worker::tasks::clients::C",
        "worker::tasks::requests",
    ];
    assert_eq!(paths, expected.map(String::from).into());
    let links = doc_links(
        "//! The [`Client`](super::client::Client) and [`crate::net::tls::Store`];\n\
         /// [x]: self::y::Z\n/// not a link: `super::prose`, nor crate::this\n// [`super::a`]",
    );
    assert_eq!(
        links,
        "super::client::Client;\ncrate::net::tls::Store;\nself::y::Z;\n"
    );
    // From a folder's root, `self::` and `super::` are its own and its parent's.
    let paths = module_paths(
        &source::tokens("use self::a::X; use super::b;"),
        &module_of("worker/tasks/mod.rs"),
    );
    assert_eq!(paths, [vec!["worker", "tasks", "a", "X"], vec!["worker", "b"]]);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), ["b".to_owned()].into()),
        ("b".to_owned(), ["c".to_owned()].into()),
        ("c".to_owned(), ["a".to_owned()].into()),
    ]
    .into();
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(4));
}

/// The `worker` names the code map says the master may use: the list after "it names only
/// `worker`'s interface types (" in docs/ARCHITECTURE.md, up to its `;`.
fn worker_interface() -> BTreeSet<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(&doc).unwrap().replace('\n', " ");
    let list = text
        .split("it names only `worker`'s interface types (")
        .nth(1)
        .and_then(|l| l.split(';').next())
        .expect("the code map lists the worker's interface types the master names");
    list.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// Issue 43: the master names of `worker` only the interface types the code map lists
/// (`worker::Setup`, `worker::datagram::Settings`...), whether through `crate::worker::`
/// or a `worker::` path after `use crate::worker`: a driver's own type (its settings, its
/// limits) reaches it only inside what `dispatch` gives it, unnamed.
#[test]
fn issue_43_the_master_names_only_the_workers_interface() {
    let allowed = worker_interface();
    let src = source::src_dir();
    let mut wrong = BTreeSet::new();
    for file in source::rust_files(&src.join("master")) {
        let rel = source::relative(&src, &file);
        let tokens = source::tokens(&std::fs::read_to_string(&file).unwrap());
        let mut paths = module_paths(&tokens, &module_of(&rel));
        // `worker::X` after `use crate::worker::{self, ...}`.
        for (k, t) in tokens.iter().enumerate() {
            let starts = t.ident
                && t.text == "worker"
                && tokens.get(k + 1).is_some_and(|n| n.text == "::")
                && (k == 0 || tokens[k - 1].text != "::");
            if starts {
                let mut at = k + 2;
                let mut path = vec!["worker".to_owned()];
                while let Some(t) = tokens.get(at).filter(|t| t.ident) {
                    path.push(t.text.clone());
                    if tokens.get(at + 1).is_some_and(|n| n.text == "::") {
                        at += 2;
                    } else {
                        break;
                    }
                }
                paths.push(path);
            }
        }
        for path in paths {
            if path.first().map(String::as_str) != Some("worker") || path.len() < 2 {
                continue; // not the worker's, or `use crate::worker::{self}`
            }
            let named = (2..=path.len()).any(|n| allowed.contains(&path[1..n].join("::")));
            if !named {
                wrong.insert(format!("{rel}: worker::{}", path[1..].join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the master names worker types the code map does not list as its interface ({allowed:?}):\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

//! The source tree's layering (issue 15): every `crate::` path in `src/` must name a group
//! that the code map in `docs/ARCHITECTURE.md` allows its group to use, the map itself has
//! no cycle, and every group in `src/` is in the map. A new dependency that breaks the
//! layering fails here, with the file and the path.

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
            // Re-exports at the root (`crate::Server`, `crate::Result`) name the group
            // that defines them; lower case is a module.
            if head == group || head.starts_with(char::is_uppercase) || allowed.contains("*") {
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

//! The pages' templates, compiled to Rust when the example is built (askama): a request
//! runs straight-line code that writes the page, with no template to find, parse or
//! interpret, and a template that names a field the data does not have is a build error,
//! not a blank on the page. Every value is HTML-escaped (`& < > " '` become `&#38; &#60;
//! &#62; &#34; &#39;`) unless a template says otherwise, and none does; the markup in the
//! seed data's titles shows it.
//!
//! This is the far end of the "template cache" a PHP server keeps in its opcode cache:
//! nothing is left to cache at run time. The templates are in `templates/`, found through
//! the crate's `askama.toml`; their block tags end with `-%}`, which drops the newline
//! after the tag, so that the pages are the markup as written, one element per line; and
//! each file ends with an empty line, since askama drops a template's last newline.

use askama::Template;

use crate::db::{Front, Item, Table};

/// `/`.
#[derive(Template)]
#[template(path = "front.html")]
pub(crate) struct FrontPage<'a> {
    pub(crate) front: &'a Front,
}

/// `/rows?n=N`.
#[derive(Template)]
#[template(path = "rows.html")]
pub(crate) struct RowsPage<'a> {
    pub(crate) table: &'a Table,
}

/// `/item/ID`.
#[derive(Template)]
#[template(path = "item.html")]
pub(crate) struct ItemPage<'a> {
    pub(crate) item: &'a Item,
}

//! The pages' templates: compiled once per worker (by the handler factory) and kept, so a
//! request renders a template that is already parsed. minijinja escapes every value in an
//! `.html` template (`& < > " ' /`); the markup in the seed data's titles shows it.

use std::io;

use minijinja::Environment;
use serde::Serialize;

/// The templates, with their names.
const TEMPLATES: [(&str, &str); 3] = [
    ("front.html", include_str!("templates/front.html")),
    ("rows.html", include_str!("templates/rows.html")),
    ("item.html", include_str!("templates/item.html")),
];

/// A worker's template cache.
#[derive(Debug)]
pub(crate) struct Pages {
    env: Environment<'static>,
}

impl Pages {
    /// Parses and compiles every template (a template with an error stops the start).
    pub(crate) fn new() -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        // A block tag's own line leaves nothing in the output: the pages are the markup
        // as written, one element per line.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true)
            .build()?;
        env.set_syntax(syntax);
        // An undefined value is a bug in this example, not an empty string on the page.
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        for (name, source) in TEMPLATES {
            env.add_template(name, source)?;
        }
        Ok(Pages { env })
    }

    /// Renders template `name` with `context` into `out`.
    pub(crate) fn render(
        &self,
        name: &str,
        context: impl Serialize,
        out: &mut impl io::Write,
    ) -> io::Result<()> {
        let template = self.env.get_template(name).map_err(io::Error::other)?;
        let page = template
            .render(minijinja::value::Serde(context))
            .map_err(io::Error::other)?;
        out.write_all(page.as_bytes())
    }
}

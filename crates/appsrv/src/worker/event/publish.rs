//! Publishing on the scoreboard: the connections' counts by what they wait for, and the
//! bytes moved, once a turn (a few stores) rather than per connection.

use crate::handler::RequestHandler;
use crate::scoreboard::ConnCounts;

use super::connection::{Class, Connection};
use super::{Completion, Loop};

/// What the loop has to publish, and what it published last.
#[derive(Default)]
pub(super) struct Publishing {
    counts: ConnCounts,
    published: ConnCounts,
    /// Bytes read from and written to clients since the last [`publish`](Loop::publish):
    /// the slot's counters move once a turn, as the bytes do (issue 42: they moved when a
    /// connection closed, so keep-alive traffic showed 0).
    moved: (u64, u64),
}

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// Publishes the counts on the scoreboard when they changed, and the bytes moved since
    /// the last turn (a few stores per turn).
    pub(super) fn publish(&mut self) {
        if let Some(source) = self.source.as_mut() {
            source.publish();
        }
        let p = &mut self.publishing;
        if p.moved != (0, 0) {
            self.cfg.slot.add_bytes(p.moved.0, p.moved.1);
            p.moved = (0, 0);
        }
        p.counts.open = self.reactor.conns.len() as u32;
        if p.counts != p.published {
            self.cfg.slot.publish_counts(p.counts);
            p.published = p.counts;
        }
    }

    /// One connection more in `class`.
    pub(super) fn count(&mut self, class: Class) {
        let counts = &mut self.publishing.counts;
        match class {
            Class::Reading => counts.reading += 1,
            Class::Writing => counts.writing += 1,
            Class::Idle => counts.idle_keepalive += 1,
        }
    }

    /// One connection less in `class`.
    pub(super) fn uncount(&mut self, class: Class) {
        let counts = &mut self.publishing.counts;
        let n = match class {
            Class::Reading => &mut counts.reading,
            Class::Writing => &mut counts.writing,
            Class::Idle => &mut counts.idle_keepalive,
        };
        *n = n.saturating_sub(1);
    }

    /// Adds what connection `c` read and wrote since its last tally to the bytes the next
    /// [`publish`](Loop::publish) counts: after each pass, and when it leaves.
    pub(super) fn tally(&mut self, c: &mut Connection<'a, H>) {
        let moved = &mut self.publishing.moved;
        moved.0 += c.received - c.tallied.0;
        moved.1 += c.sent - c.tallied.1;
        c.tallied = (c.received, c.sent);
    }
}

//! A `tracing` subscriber that hands every event of turnstile's to a function: how the tests
//! read what the limiters and the tower policies log, without a subscriber crate. Spans are
//! not used by the crate, so they are accepted and ignored.
#![allow(dead_code)] // not every test binary uses every helper

/// `event` as one line: its level, then ` field=value` (`Debug` forms) for each field.
pub fn line(event: &tracing::Event<'_>) -> String {
    struct Line(String);
    impl tracing::field::Visit for Line {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", f.name(), v));
        }
    }
    let mut line = Line(event.metadata().level().to_string());
    event.record(&mut line);
    line.0
}

/// Calls its function on each event whose target is turnstile's.
pub struct Events<F>(pub F);

impl<F: Fn(&tracing::Event<'_>) + Send + Sync + 'static> tracing::Subscriber for Events<F> {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target().starts_with("turnstile") {
            (self.0)(event);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

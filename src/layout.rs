//! Where a limiter keeps its hot atomic word: [`Layout`], padded or compact.

use std::ops::Deref;

use crossbeam_utils::CachePadded;

/// Where a limiter keeps its hot atomic word: alone on its own cache lines ([`Padded`], the
/// default) or packed next to its configuration ([`Compact`]).
///
/// One limiter shared by every thread wants [`Padded`]: the word that every check CASes must
/// not share a line with unrelated data. A `Keyed` map holds thousands or
/// millions of small limiters, each touched now and then: there padding multiplies the bytes
/// per key, so the limiters also come in a [`Compact`] layout
/// (`builder(..).build_compact()` for `TokenBucket`, `LeakyMeter`, `LeakyBucket`,
/// `FixedWindow`, `SlidingWindow`, `SmoothBursty` and `SmoothWarmingUp`): the crate
/// convention's one exception.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Compact, FixedWindow};
///
/// let w: FixedWindow<_, Compact> =
///     FixedWindow::builder(10, Duration::from_secs(1)).build_compact().unwrap();
/// assert!(std::mem::size_of_val(&w) <= 64);
/// assert!(w.take().is_permitted());
/// ```
pub trait Layout: Send + Sync + 'static {
    /// The cell holding a value `T`.
    type Cell<T: Send + Sync>: Deref<Target = T> + Send + Sync;

    /// Puts `value` in a cell.
    fn cell<T: Send + Sync>(value: T) -> Self::Cell<T>;
}

/// The hot word alone on its cache lines (`crossbeam_utils::CachePadded`): for a limiter shared
/// by many threads. The default.
#[derive(Debug, Clone, Copy)]
pub enum Padded {}

impl Layout for Padded {
    type Cell<T: Send + Sync> = CachePadded<T>;

    fn cell<T: Send + Sync>(value: T) -> CachePadded<T> {
        CachePadded::new(value)
    }
}

/// The hot word next to the configuration, unpadded: for the many small limiters of a keyed map.
#[derive(Debug, Clone, Copy)]
pub enum Compact {}

/// A value with no padding: [`Compact`]'s cell.
#[derive(Debug, Default)]
pub struct Unpadded<T>(T);

impl<T> Deref for Unpadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl Layout for Compact {
    type Cell<T: Send + Sync> = Unpadded<T>;

    fn cell<T: Send + Sync>(value: T) -> Unpadded<T> {
        Unpadded(value)
    }
}

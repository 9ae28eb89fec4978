//! The options of a [`Keyed`](super::Keyed) map.

use std::convert::Infallible;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::{map, Factory, Keyed, WhenFull};
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::key_bound::KeyBound;
use crate::limiter::{Idle, Limiter};

/// Options for a [`Keyed`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedBuilder<K, L, C: Clock = QuantaClock, E = Infallible> {
    pub(super) factory: Factory<K, L, E>,
    pub(super) max_keys: u64,
    pub(super) when_full: WhenFull,
    pub(super) sweep_every: u64,
    pub(super) clock: C,
}

impl<K, L, C, E> KeyedBuilder<K, L, C, E>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
    E: 'static,
{
    /// Holds at most `max_keys` keys (default 2^20, 1 048 576; `u64::MAX`: no bound); what
    /// happens to a new key beyond that is [`KeyedBuilder::when_full`]'s policy. Zero is
    /// [`ConfigError::ZeroMaxKeys`].
    ///
    /// Keys usually come from clients (addresses, API keys, headers), so a map without a
    /// bound is memory a client flood can fill; with [`WhenFull::Deny`] a flood beyond the
    /// bound cannot hand anyone a fresh limit either. The default is well above the keys one
    /// process sees active within a sweep period, at a modest cost: an entry (~60 bytes) plus
    /// the limiter per key, about 300 MiB in all for compact token buckets (module docs,
    /// "Memory").
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .max_keys(1)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1).is_ok());
    /// assert!(k.check(&2).is_err()); // full, and key 1 is busy: refused
    /// ```
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What a new key gets when the map is full: [`WhenFull::Deny`] (the default) or
    /// [`WhenFull::Allow`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::WhenFull;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .max_keys(1)
    ///     .when_full(WhenFull::Allow)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1).is_ok());
    /// assert!(k.check(&2).is_ok()); // untracked
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// How often idle keys are swept (default 10 s). The sweep runs inline in the first
    /// check after the interval, and visits every key.
    /// `Duration::MAX` leaves sweeping to [`Keyed::evict_idle`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .sweep_every(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.is_empty());
    /// ```
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = Nanos::from_duration(every).as_u64();
        self
    }

    /// Reads time from `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .clock(ManualClock::new(Nanos::new(2)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(2));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> KeyedBuilder<K, L, D, E> {
        KeyedBuilder {
            factory: self.factory,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock,
        }
    }

    /// The keyed limiter; a `max_keys` of 0 is [`ConfigError::ZeroMaxKeys`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    /// let err = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .max_keys(0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroMaxKeys);
    /// ```
    pub fn build(self) -> Result<Keyed<K, L, C, E>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let now = self.clock.now().as_u64();
        Ok(Keyed {
            map: map::Map::new(),
            factory: self.factory,
            bound: KeyBound::new(
                self.max_keys,
                self.when_full,
                self.sweep_every,
                Nanos::new(now),
            ),
            clock: self.clock,
        })
    }
}

impl<K, L, C: Clock, E> fmt::Debug for KeyedBuilder<K, L, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyedBuilder");
        KeyBound::debug_fields(&mut d, self.max_keys, self.when_full, self.sweep_every);
        d.finish()
    }
}

//! [`Enforced`]: a policy whose refusals are enforced, observed only (shadow mode), or
//! enforced for a stable fraction of clients, switchable at run time through an
//! [`Enforcement`] handle; with its decisions counted.

use std::future::Future;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;

use super::*;
use crate::striped_counters::StripedCounters;
use crate::ConfigError;

/// How a policy's refusals are applied: see [`Enforcement`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Every refusal is enforced: the request is refused.
    Enforce,
    /// No refusal is enforced: a request the policy refuses goes on, and is counted as
    /// shadow-refused.
    Shadow,
    /// The refusals of this fraction of clients (0 to 1) are enforced, the others' are
    /// shadow ones. A client is in or out by a hash of its key, so it stays on one side
    /// while the fraction stands, and raising the fraction only adds clients.
    Fraction(f64),
}

/// The enforcement mode of one or more [`Enforced`] policies ([`PolicyExt::enforcement`]):
/// a handle, cheap to clone, through which an operator changes the mode at run time
/// without rebuilding the layer. A decision reads the mode once, so each request is judged
/// wholly under the mode before a change or wholly under the one after it.
///
/// A roll-out in three steps:
///
/// ```
/// use turnstile::tower::{key, per_key, Enforcement, Mode, PolicyExt, RateLimitLayer};
/// use turnstile::{KeyedTokenBucket, Limit};
///
/// // 1. Observe: nothing is refused; `counts().shadow_refused` says what would have been.
/// let enforcement = Enforcement::shadow();
/// let per_ip = per_key(
///     "per-ip",
///     key::PeerIp,
///     KeyedTokenBucket::new(Limit::per_second(10.0).unwrap(), 20),
/// )
/// .enforcement(enforcement.clone());
/// let layer = RateLimitLayer::new(per_ip);
/// // 2. Enforce for a tenth of the clients (the same tenth until the fraction changes).
/// enforcement.set(Mode::Fraction(0.1)).unwrap();
/// // 3. Enforce for everyone.
/// enforcement.set(Mode::Enforce).unwrap();
/// assert_eq!(enforcement.mode(), Mode::Enforce);
/// let counts = layer.policy().counts();
/// assert_eq!((counts.allowed, counts.refused, counts.shadow_refused), (0, 0, 0));
/// ```
///
/// With the feature `tracing`, each change is an `info` event with the handle's name
/// ([`Enforcement::named`]) and the modes before and after, and a fraction refused a `warn`
/// event.
#[derive(Debug, Clone)]
pub struct Enforcement {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The enforced share of the 63-bit hash space: a client whose hash (shifted down one
    /// bit) is below it is enforced. 0 is shadow mode, [`ALL`] enforces everyone.
    threshold: AtomicU64,
    /// The handle's name in its events (and its `Debug`).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    name: Option<Arc<str>>,
}

/// The threshold that enforces every client: every 63-bit hash is below it.
const ALL: u64 = 1 << 63;

impl Enforcement {
    /// A handle starting in `mode`; an error if it is a fraction that is NaN or outside
    /// `[0, 1]`.
    pub fn new(mode: Mode) -> Result<Self, ConfigError> {
        Ok(Enforcement::at(threshold(mode)?))
    }

    /// A handle enforcing every refusal.
    pub fn enforce() -> Self {
        Enforcement::at(ALL)
    }

    /// A handle enforcing none: shadow mode.
    pub fn shadow() -> Self {
        Enforcement::at(0)
    }

    fn at(threshold: u64) -> Self {
        Enforcement {
            shared: Arc::new(Shared {
                threshold: AtomicU64::new(threshold),
                name: None,
            }),
        }
    }

    /// This handle named `name` in its events (the roll-out it drives: the policies on it,
    /// a ticket): a new handle in the same mode, so name it before cloning it.
    pub fn named(self, name: impl Into<Arc<str>>) -> Self {
        Enforcement {
            shared: Arc::new(Shared {
                threshold: AtomicU64::new(self.shared.threshold.load(Ordering::Relaxed)),
                name: Some(name.into()),
            }),
        }
    }

    /// Switches every policy on this handle to `mode`; an error (and no change) if it is a
    /// fraction that is NaN or outside `[0, 1]`.
    pub fn set(&self, mode: Mode) -> Result<(), ConfigError> {
        let t = match threshold(mode) {
            Ok(t) => t,
            Err(e) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    enforcement = self.shared.name.as_deref(),
                    mode = ?mode,
                    error = %e,
                    "turnstile: enforcement mode not changed"
                );
                return Err(e);
            }
        };
        let _before = self.shared.threshold.swap(t, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        tracing::info!(
            enforcement = self.shared.name.as_deref(),
            from = ?mode_of(_before),
            to = ?mode_of(t),
            "turnstile: enforcement mode changed"
        );
        Ok(())
    }

    /// The mode: [`Mode::Enforce`] and [`Mode::Shadow`] as set (a fraction of 1 or 0 reads
    /// back as them), any other fraction as the share of hashes it enforces (within 2^-63 of
    /// the one set).
    pub fn mode(&self) -> Mode {
        mode_of(self.shared.threshold.load(Ordering::Relaxed))
    }

    /// Whether a client with `hash` is enforced: its top 63 bits below the threshold.
    #[inline]
    fn enforces(&self, hash: impl FnOnce() -> u64) -> bool {
        // Relaxed: the mode guards no other data; a decision reads it once and acts on
        // that reading alone.
        match self.shared.threshold.load(Ordering::Relaxed) {
            ALL => true,
            0 => false,
            t => hash() >> 1 < t,
        }
    }
}

/// The mode of threshold `t`.
fn mode_of(t: u64) -> Mode {
    match t {
        0 => Mode::Shadow,
        ALL => Mode::Enforce,
        t => Mode::Fraction(t as f64 / ALL as f64),
    }
}

/// The threshold of `mode`, rounded to the nearest share of the 63-bit hash space.
fn threshold(mode: Mode) -> Result<u64, ConfigError> {
    match mode {
        Mode::Enforce => Ok(ALL),
        Mode::Shadow => Ok(0),
        Mode::Fraction(f) if (0.0..=1.0).contains(&f) => Ok((f * ALL as f64).round() as u64),
        Mode::Fraction(f) => Err(ConfigError::EnforcedFraction(f)),
    }
}

/// What an [`Enforced`] policy decided, counted since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Requests the policy granted.
    pub allowed: u64,
    /// Requests it refused, with the refusal enforced.
    pub refused: u64,
    /// Requests it refused that went on, their client not enforced ([`Mode::Shadow`], or
    /// outside the [`Mode::Fraction`]).
    pub shadow_refused: u64,
}

const ALLOWED: usize = 0;
const REFUSED: usize = 1;
const SHADOW_REFUSED: usize = 2;

/// A policy under an [`Enforcement`] mode, with its decisions counted:
/// [`PolicyExt::enforcement`].
///
/// **What shadow mode consumes.** Exactly what enforcement would: the inner policy decides
/// as it always does, so a grant takes its permits and a refusal takes none, and a request
/// it refuses then goes on without taking any. The limiter's state therefore follows the
/// same path as under enforcement, and [`Counts::shadow_refused`] is the number of requests
/// enforcement would have refused, not an estimate that drifts as shadow traffic drains the
/// limit (were shadow-refused requests charged, every later one would be refused too; were
/// grants not charged, none would be). A grant that the layer's
/// [delay mode](super::super::RateLimitLayer::delay) would hold until its reserved permits
/// are due goes on at once for a client that is not enforced, its reservation kept, so
/// that the limiter again sees what it would under enforcement, and the client no delay.
///
/// Under [`And`], a shadow refusal is a pass: the other policy is still asked, and a grant
/// of the other one is kept.
pub struct Enforced<P, S = RandomState> {
    // An `Arc`, as `And`'s halves: `Policy::decide` takes the policy as `&Arc<Self>`.
    pub(super) inner: Arc<P>,
    pub(super) enforcement: Enforcement,
    pub(super) hasher: S,
    /// Boxed: a set of striped counters is a few kilobytes, and the policy is moved by value
    /// while it is built.
    pub(super) counts: Box<StripedCounters<3>>,
}

impl<P> Enforced<P> {
    pub(super) fn new(inner: P, enforcement: Enforcement) -> Self {
        Enforced {
            inner: Arc::new(inner),
            enforcement,
            hasher: RandomState::new(),
            counts: Box::new(StripedCounters::new()),
        }
    }
}

impl<P, S> Enforced<P, S> {
    /// The policy enforced.
    pub fn policy(&self) -> &P {
        &self.inner
    }

    /// Its enforcement handle.
    pub fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    /// Its decisions so far: exact once the requests counted have been answered.
    pub fn counts(&self) -> Counts {
        Counts {
            allowed: self.counts.get(ALLOWED),
            refused: self.counts.get(REFUSED),
            shadow_refused: self.counts.get(SHADOW_REFUSED),
        }
    }

    /// Hashes clients with `hasher` when picking a [`Mode::Fraction`], instead of std's
    /// `RandomState`. The default's secret key keeps a client from choosing a key outside
    /// the enforced fraction (an address or a header value it controls), and differs from
    /// process to process; a fleet whose instances must agree on who is enforced gives each
    /// the same keyed hasher, its key kept secret.
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> Enforced<P, T> {
        Enforced {
            inner: self.inner,
            enforcement: self.enforcement,
            hasher,
            counts: self.counts,
        }
    }

    /// `d` under the mode read for its client (`enforced`): counted, and a refusal of a
    /// client not enforced turned into a pass.
    fn judge<G>(&self, d: Decision<G>, enforced: bool) -> Decision<Option<G>> {
        let Decision {
            result,
            wait,
            report,
        } = d;
        match result {
            Ok(grant) => {
                self.counts.add(ALLOWED, 1);
                Decision {
                    result: Ok(Some(grant)),
                    wait: if enforced { wait } else { Duration::ZERO },
                    report,
                }
            }
            Err(denied) if enforced => {
                self.counts.add(REFUSED, 1);
                Decision {
                    result: Err(denied),
                    wait: Duration::ZERO,
                    report,
                }
            }
            Err(_) => {
                self.counts.add(SHADOW_REFUSED, 1);
                Decision {
                    result: Ok(None),
                    wait: Duration::ZERO,
                    report,
                }
            }
        }
    }
}

impl<B: 'static, P, S> Policy<B> for Enforced<P, S>
where
    P: Policy<B>,
    S: BuildHasher + Send + Sync + 'static,
{
    type Key = P::Key;
    /// The inner policy's grant, or none for a refusal that went on (it took nothing).
    type Grant = Option<P::Grant>;
    type Future = EnforcedFuture<B, P, S>;

    #[inline]
    fn key(&self, req: &Request<B>) -> Self::Key {
        self.inner.key(req)
    }

    fn decide(self: &Arc<Self>, key: Self::Key, ask: Ask) -> Self::Future {
        // Enforced only if every `Enforced` policy above enforces it too: one that does not
        // lets the request through whatever this one says.
        let enforced = ask.enforced
            && self.enforcement.enforces(|| {
                let mut h = self.hasher.build_hasher();
                self.inner.hash_client(&key, &mut h);
                h.finish()
            });
        let mut fut = self.inner.decide(key, Ask { enforced, ..ask });
        // An in-process policy has decided already: judge it here, so that the common case
        // holds no reference to the policy (a count more on its `Arc` would be two writes to
        // a shared line per request).
        let noop = &mut Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut fut).poll(noop) {
            Poll::Ready(d) => EnforcedFuture(Inner::Decided(Some(self.judge(d, enforced)))),
            Poll::Pending => EnforcedFuture(Inner::Deciding {
                fut,
                enforced,
                policy: self.clone(),
            }),
        }
    }

    fn refund(&self, grant: Self::Grant) {
        if let Some(grant) = grant {
            self.inner.refund(grant);
        }
    }

    fn hash_client<H: Hasher>(&self, key: &Self::Key, state: &mut H) {
        self.inner.hash_client(key, state);
    }
}

impl<P: Refunds, S> Refunds for Enforced<P, S> {}

/// [`Enforced`]'s decision in flight.
pub struct EnforcedFuture<B, P: Policy<B>, S>(Inner<B, P, S>);

enum Inner<B, P: Policy<B>, S> {
    /// Judged at once (an in-process policy).
    Decided(Option<Decision<Option<P::Grant>>>),
    /// The inner policy still deciding (a Redis round trip), judged when it answers.
    Deciding {
        fut: P::Future,
        enforced: bool,
        policy: Arc<Enforced<P, S>>,
    },
}

// Nothing of it is ever pinned but the inner future, which `Policy::Future` makes `Unpin`.
impl<B, P: Policy<B>, S> Unpin for EnforcedFuture<B, P, S> {}

impl<B, P: Policy<B>, S> Future for EnforcedFuture<B, P, S> {
    type Output = Decision<Option<P::Grant>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::Decided(d) => Poll::Ready(d.take().expect("polled after completion")),
            Inner::Deciding {
                fut,
                enforced,
                policy,
            } => Pin::new(fut).poll(cx).map(|d| policy.judge(d, *enforced)),
        }
    }
}

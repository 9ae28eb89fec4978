//! [`Blocking`]: any Redis limiter, for synchronous code, as `reqwest::blocking` and
//! redis-rs's sync API are for theirs.
//!
//! # Why it exists
//! The Redis limiters are async: their connection is driven by a tokio task, and a check is a
//! future. A program with no async code of its own (a thread-per-request server, a CLI, a
//! batch job) cannot `.await` one, and should not need to know how to start a runtime to use
//! it. `Blocking<L>` wraps any [`RedisLimiter`] (a [`Gcra`](super::Gcra), a
//! [`TokenBucket`](super::TokenBucket), a [`FixedWindow`](super::FixedWindow), or a
//! [`Fallback`](super::Fallback) over one) behind plain methods that block the calling
//! thread until the answer is in.
//!
//! # How it works, and what it costs
//! The wrapper owns a tokio runtime: [`Blocking::new`] builds a multi-thread runtime with
//! **one** worker thread, named `turnstile-redis`, with the IO and time drivers. The limiter
//! is built *inside* it (the async closure given to `new` runs there), so the connection's
//! driver task, and a [`Fallback`](super::Fallback)'s health check, are spawned on that
//! runtime and run on its worker, between calls too: that is how a fallback goes back to
//! Redis while nobody is calling.
//!
//! Each call is one [`Runtime::block_on`] on the caller's own thread: the caller's thread
//! polls the check's future and sleeps while it waits, the worker thread does the socket IO
//! and wakes the caller when the reply is in. Compared with awaiting the async limiter from
//! an async program, a call adds that wake-up of a sleeping thread (one hop from the IO
//! driver's thread to the caller's) to the round trip; this crate publishes no measurement
//! of it (measure it where it matters). Any number of threads may call at once through a
//! shared reference (`Blocking` is `Send + Sync`; put it in an [`Arc`](std::sync::Arc)):
//! tokio's multi-thread `block_on` takes `&self` and parks only its own caller, and every
//! call shares the limiter's one multiplexed connection. The fixed cost is the worker
//! thread, plus tokio's blocking pool, which starts threads only when something needs one
//! (a DNS lookup while connecting).
//!
//! # A deadline on every call
//! Every call ([`Blocking::try_check_n`], [`Blocking::ping`], [`Blocking::run`],
//! [`Blocking::block_on`]) waits at most the wrapper's deadline ([`BlockingBuilder::deadline`],
//! default 250 ms) and then answers
//! [`RedisLimitError::Timeout`]: a stalled Redis never holds a caller's thread longer, even
//! over a connection built without a response timeout. (A [`Fallback`](super::Fallback)
//! inside answers within its own, shorter, timeout first.)
//!
//! # Not from inside an async runtime
//! Blocking a thread on which a tokio runtime is current would stall that runtime, and
//! tokio's `block_on` panics there. Every method checks first
//! ([`Handle::try_current`](tokio::runtime::Handle::try_current)) and returns
//! [`RedisLimitError::InsideAsyncRuntime`] instead: async code should await the limiter
//! itself ([`Blocking::limiter`]). The check cannot tell the few runtime threads where
//! blocking is allowed (a `spawn_blocking` closure, `block_in_place`, under
//! `Runtime::enter`) from the rest, so those are refused too.
//!
//! ```
//! use turnstile::redis::{self, Blocking, Gcra, RedisLimitError};
//! use turnstile::Limit;
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() {
//!     // Async code: refused before anything is built or sent.
//!     let built = Blocking::new(|| async {
//!         let con = redis::connect("redis://127.0.0.1:6379/").await?;
//!         Ok(Gcra::new(con, Limit::per_second(10.0)?, 5)?)
//!     });
//!     let e = built.unwrap_err();
//!     assert!(matches!(
//!         e.downcast_ref::<RedisLimitError>(),
//!         Some(RedisLimitError::InsideAsyncRuntime)
//!     ));
//! }
//! ```
//!
//! # Dropping
//! Dropping a `Blocking` drops the limiter (which aborts its connection's task and its
//! health check), then shuts the runtime down with
//! [`Runtime::shutdown_background`]: the drop does not wait for the worker to stop, so it
//! never blocks, and it is allowed inside an async runtime too (where dropping a tokio
//! runtime panics). The worker thread exits on its own right after.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime, RuntimeFlavor};

use super::{RedisLimitError, RedisLimiter, DEFAULT_DEADLINE};
use crate::{ConfigError, Denied};

/// The name of the worker thread of the runtime [`Blocking::new`] builds.
const THREAD_NAME: &str = "turnstile-redis";

/// What the builder closure and construction may fail with: anything, so that `?` works on
/// [`RedisLimitError`] and [`ConfigError`] alike.
type BoxError = Box<dyn Error + Send + Sync>;

/// A Redis limiter for synchronous code: every method blocks the calling thread on a tokio
/// runtime the wrapper owns. See the [module docs](self) for how it works, what it costs and
/// where it refuses to block.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use turnstile::redis::{self, Blocking, Fallback, Gcra};
/// use turnstile::Limit;
///
/// fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     // 100 requests a second per client, bursts of 20, shared by the fleet; answered in
///     // process while Redis is unreachable.
///     let limiter = Arc::new(Blocking::new(|| async {
///         let con = redis::connect("redis://10.0.0.5:6379/").await?;
///         let gcra = Gcra::new(con, Limit::per_second(100.0)?, 20)?;
///         Ok(Fallback::builder(gcra).timeout(Duration::from_millis(50)).build()?)
///     })?);
///     // One thread per request, no async anywhere.
///     let requests: Vec<_> = (0..4)
///         .map(|_| {
///             let limiter = Arc::clone(&limiter);
///             std::thread::spawn(move || limiter.try_check("client-42"))
///         })
///         .collect();
///     for request in requests {
///         match request.join().unwrap()? {
///             Ok(()) => { /* serve */ }
///             Err(denied) => println!("429, Retry-After: {:?}", denied.retry_after_secs()),
///         }
///     }
///     println!("answers from {:?}", limiter.limiter().mode());
///     Ok(())
/// }
/// ```
pub struct Blocking<L> {
    // Both are `Some` from construction until `drop`, which takes them in this order: the
    // limiter is dropped inside the runtime's context, then the runtime shuts down.
    limiter: Option<L>,
    runtime: Option<Runtime>,
    deadline: Duration,
}

impl Blocking<()> {
    /// A builder for options: a runtime of your own ([`runtime`](BlockingBuilder::runtime)),
    /// a deadline ([`deadline`](BlockingBuilder::deadline)), then
    /// [`build`](BlockingBuilder::build) with the function that makes the limiter, as
    /// [`Blocking::new`] takes it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use turnstile::redis::{self, Blocking, Gcra};
    /// use turnstile::Limit;
    ///
    /// fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    ///     let limiter = Blocking::builder()
    ///         .deadline(Duration::from_millis(50))
    ///         .build(|| async {
    ///             let con = redis::connect("redis://127.0.0.1:6379/").await?;
    ///             Ok(Gcra::new(con, Limit::per_second(10.0)?, 5)?)
    ///         })?;
    ///     assert_eq!(limiter.deadline(), Duration::from_millis(50));
    ///     Ok(())
    /// }
    /// ```
    pub fn builder() -> BlockingBuilder {
        BlockingBuilder {
            runtime: None,
            deadline: DEFAULT_DEADLINE,
        }
    }
}

impl<L> Blocking<L> {
    /// Builds a runtime (multi-thread, one worker thread named `turnstile-redis`, IO and
    /// time enabled) and runs `make`'s future on it to build the limiter, so that the
    /// connection and any background task are spawned on that runtime. Calls wait at most
    /// 250 ms; [`Blocking::builder`] changes that, or brings a runtime of your own.
    ///
    /// The closure's error type is `Box<dyn Error + Send + Sync>`, so `?` works on
    /// [`connect`](super::connect)'s [`RedisLimitError`] and on a constructor's
    /// [`ConfigError`] alike.
    ///
    /// ```no_run
    /// use turnstile::redis::{self, Blocking, Gcra};
    /// use turnstile::Limit;
    ///
    /// fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    ///     let limiter = Blocking::new(|| async {
    ///         let con = redis::connect("redis://127.0.0.1:6379/").await?;
    ///         Ok(Gcra::new(con, Limit::per_second(10.0)?, 5)?)
    ///     })?;
    ///     assert!(limiter.try_check("client-42")?.is_ok());
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// `make`'s error; [`RedisLimitError::InsideAsyncRuntime`] when called where a tokio
    /// runtime is current (nothing is built); the runtime's own `std::io::Error` if its
    /// thread cannot be started. Downcast to tell them apart
    /// (`e.downcast_ref::<RedisLimitError>()`).
    pub fn new<F, Fut>(make: F) -> Result<Blocking<L>, BoxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<L, BoxError>>,
    {
        Blocking::builder().build(make)
    }

    /// The most a call waits before it answers [`RedisLimitError::Timeout`] (250 ms unless
    /// set with [`BlockingBuilder::deadline`]).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The wrapped async limiter: for its other methods ([`Gcra::limit`](super::Gcra::limit),
    /// [`Fallback::mode`](super::Fallback::mode)...), or to await it from async code.
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<turnstile::redis::Fallback<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>>) {
    /// if limiter.limiter().mode() == turnstile::redis::Mode::Fallback {
    ///     eprintln!("Redis unreachable since {:?}", limiter.limiter().stats().last_switch);
    /// }
    /// # }
    /// ```
    pub fn limiter(&self) -> &L {
        self.limiter
            .as_ref()
            .unwrap_or_else(|| unreachable!("set by construction, taken only by drop"))
    }

    /// Runs `fut` to completion on the wrapper's runtime, blocking this thread: for anything
    /// async the plain methods do not cover (the limiter's own async methods, a command on a
    /// connection of yours). Outputs that are `Result`s are easier with [`Blocking::run`].
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>,
    /// # ) -> Result<(), turnstile::redis::RedisLimitError> {
    /// // Gcra::peek: what "client-42" has left, taking nothing.
    /// let left = limiter.block_on(limiter.limiter().peek("client-42"))??.remaining;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`RedisLimitError::Timeout`] (and `fut` is dropped) past the deadline
    /// ([`BlockingBuilder::deadline`]); [`RedisLimitError::InsideAsyncRuntime`] (and `fut` is
    /// not run) when called where a tokio runtime is current.
    pub fn block_on<F: Future>(&self, fut: F) -> Result<F::Output, RedisLimitError> {
        outside_runtime()?;
        let deadline = self.deadline;
        self.runtime().block_on(async move {
            tokio::time::timeout(deadline, fut)
                .await
                .map_err(|_elapsed| RedisLimitError::Timeout(deadline))
        })
    }

    /// Calls `f` with the wrapped limiter and runs the future it returns on the wrapper's
    /// runtime, blocking this thread; the future's error and this method's own are one:
    /// [`Blocking::block_on`] for async methods that return a `Result`.
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>,
    /// # ) -> Result<(), turnstile::redis::RedisLimitError> {
    /// // Gcra::throttle: CL.THROTTLE's whole answer for 3 permits.
    /// let t = limiter.run(|gcra| gcra.throttle("client-42", 3))?;
    /// println!("allowed {}, {} left, full again in {:?}", t.allowed, t.remaining, t.reset_after);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The future's error; [`RedisLimitError::Timeout`] past the deadline
    /// ([`BlockingBuilder::deadline`]) and [`RedisLimitError::InsideAsyncRuntime`] (and `f` is
    /// not called) when called where a tokio runtime is current, both converted into it.
    pub fn run<'a, T, E, Fut>(&'a self, f: impl FnOnce(&'a L) -> Fut) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
        E: From<RedisLimitError>,
    {
        outside_runtime()?;
        let limiter = self.limiter();
        let deadline = self.deadline;
        // `f` is called inside the runtime's context too, in case it does more than build
        // a future.
        self.runtime().block_on(async move {
            match tokio::time::timeout(deadline, f(limiter)).await {
                Ok(answer) => answer,
                Err(_elapsed) => Err(RedisLimitError::Timeout(deadline).into()),
            }
        })
    }

    fn runtime(&self) -> &Runtime {
        self.runtime
            .as_ref()
            .unwrap_or_else(|| unreachable!("set by construction, taken only by drop"))
    }
}

impl<L: RedisLimiter> Blocking<L> {
    /// One permit for `key`: [`Blocking::try_check_n`] with `n = 1`.
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>,
    /// # ) -> Result<(), turnstile::redis::RedisLimitError> {
    /// match limiter.try_check("client-42")? {
    ///     Ok(()) => { /* serve */ }
    ///     Err(denied) => println!("429, Retry-After: {:?}", denied.retry_after_secs()),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Blocking::try_check_n`].
    pub fn try_check(&self, key: &str) -> Result<Result<(), Denied>, RedisLimitError> {
        self.try_check_n(key, 1)
    }

    /// Takes `n` permits for `key` if the shared limit has them: the wrapped limiter's
    /// [`RedisLimiter::try_check_n`], blocking this thread until it answers. The outer error
    /// is bad input or Redis failing (from a [`Fallback`](super::Fallback), only bad input), the
    /// inner `Err` a denial with its retry time, all within the deadline
    /// ([`BlockingBuilder::deadline`]).
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>,
    /// # ) -> Result<(), turnstile::redis::RedisLimitError> {
    /// let batch_allowed = limiter.try_check_n("client-42", 5)?.is_ok();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The wrapped limiter's ([`RedisLimitError::EmptyKey`],
    /// [`RedisLimitError::ExceedsBurst`], Redis's own), [`RedisLimitError::Timeout`] past the
    /// deadline, and
    /// [`RedisLimitError::InsideAsyncRuntime`] when called where a tokio runtime is current.
    pub fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        self.run(|limiter| limiter.try_check_n(key, n))
    }

    /// One `PING` through the wrapped limiter's connection ([`RedisLimiter::ping`]): a
    /// readiness probe.
    ///
    /// ```no_run
    /// # fn f(limiter: turnstile::redis::Blocking<
    /// #     turnstile::redis::Gcra<turnstile::redis::ConnectionManager>>) {
    /// let redis_ok = limiter.ping().is_ok();
    /// # }
    /// ```
    ///
    /// # Errors
    /// Redis's error, and [`RedisLimitError::InsideAsyncRuntime`] when called where a tokio
    /// runtime is current.
    pub fn ping(&self) -> Result<(), RedisLimitError> {
        self.run(|limiter| limiter.ping())
    }
}

impl<L> Drop for Blocking<L> {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        {
            // The limiter goes first, in the runtime's context (its tasks are aborted, and
            // anything its drop spawns finds a runtime). `enter` does not block, so this is
            // allowed inside another runtime too.
            let _context = runtime.enter();
            drop(self.limiter.take());
        }
        // Not `drop(runtime)`: that waits for the blocking pool's threads, and panics inside
        // an async context.
        runtime.shutdown_background();
    }
}

impl<L: fmt::Debug> fmt::Debug for Blocking<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocking")
            .field("limiter", self.limiter())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
/// Options for a [`Blocking`] wrapper: [`Blocking::builder`], then
/// [`build`](BlockingBuilder::build), which checks them and makes the limiter.
#[must_use = "a builder does nothing until `build` is called"]
pub struct BlockingBuilder {
    runtime: Option<Runtime>,
    deadline: Duration,
}

impl BlockingBuilder {
    /// Runs on `runtime` instead of a runtime of the wrapper's own (more worker threads,
    /// other names, thread hooks). It must be a multi-thread runtime with the IO and time
    /// drivers enabled (`Builder::new_multi_thread().enable_all()`); the wrapper owns it from
    /// `build` on and shuts it down when dropped, even when `build` fails.
    ///
    /// ```no_run
    /// use turnstile::redis::{self, Blocking, TokenBucket};
    ///
    /// fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    ///     let runtime = tokio::runtime::Builder::new_multi_thread()
    ///         .worker_threads(2)
    ///         .thread_name("limiter-io")
    ///         .enable_all()
    ///         .build()?;
    ///     let limiter = Blocking::builder().runtime(runtime).build(|| async {
    ///         let con = redis::connect("redis://127.0.0.1:6379/").await?;
    ///         Ok(TokenBucket::new(con, 10, 20)?)
    ///     })?;
    ///     assert!(limiter.try_check("client-42")?.is_ok());
    ///     Ok(())
    /// }
    /// ```
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Bounds every call by `deadline` instead of the default 250 ms.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Runs `make`'s future on the runtime to build the limiter, so that the connection and
    /// any background task are spawned on that runtime: see [`Blocking::new`].
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`] for a zero deadline (every call would time out);
    /// [`ConfigError::CurrentThreadRuntime`] for a current-thread runtime (it would run the
    /// connection's task and a fallback's health check only during calls, so a fallback
    /// could stay in fallback forever); [`RedisLimitError::InsideAsyncRuntime`] when called
    /// where a tokio runtime is current (nothing is built); the runtime's own
    /// `std::io::Error` if its thread cannot be started; `make`'s error.
    pub fn build<L, F, Fut>(self, make: F) -> Result<Blocking<L>, BoxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<L, BoxError>>,
    {
        // From here on, any early return shuts a runtime of the caller's down in the
        // background (`drop`).
        let mut blocking = Blocking {
            limiter: None,
            runtime: self.runtime,
            deadline: self.deadline,
        };
        if blocking.deadline.is_zero() {
            return Err(ConfigError::ZeroTimeout.into());
        }
        if let Some(runtime) = &blocking.runtime {
            if runtime.handle().runtime_flavor() == RuntimeFlavor::CurrentThread {
                return Err(ConfigError::CurrentThreadRuntime.into());
            }
        }
        outside_runtime()?;
        if blocking.runtime.is_none() {
            blocking.runtime = Some(
                Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name(THREAD_NAME)
                    .enable_all()
                    .build()?,
            );
        }
        blocking.limiter = Some(blocking.runtime().block_on(async { make().await })?);
        Ok(blocking)
    }
}

impl fmt::Debug for BlockingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingBuilder")
            .field("runtime", &self.runtime.as_ref().map(|_| "(caller's)"))
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// `Err(InsideAsyncRuntime)` on a thread where a tokio runtime is current, where `block_on`
/// would panic.
fn outside_runtime() -> Result<(), RedisLimitError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        Err(RedisLimitError::InsideAsyncRuntime)
    } else {
        Ok(())
    }
}

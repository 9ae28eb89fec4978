//! The two scripts under [`Leased`](super::Leased): take up to `want` permits from a
//! [`Gcra`] key at once, and hand unspent ones back. Same key, same value format and same
//! expiry rule as [`SCRIPT`](super::gcra::SCRIPT), so leasing clients and plain `Gcra`
//! clients of one key share one bucket.
//!
//! # Granting many at once, exactly
//! A lease of `m` permits is `m` grants at one instant: `tat' = max(tat, now) + m × T`, allowed
//! while `d + m × T <= tau` (`d = max(tat, now) - now`). The most the bucket has is
//! `m = min(want, floor((tau - d) / T))`; the lease is refused if that is below `need`.
//!
//! The script must stay exact in Lua's doubles, where `m × T_units` (up to 2³² × 10¹²) is not.
//! So it never multiplies or divides: the client sends `2^i × T` for each bit `i` of `want`
//! (computed in `u128`, each at most `tau`), and the script finds `m` by binary descent, from
//! the highest bit down, adding `2^i × T` (with the (µs, units) carry of `SCRIPT`) wherever
//! both `m + 2^i <= want` and the sum stays within `tau`. Both conditions hold for every `m`
//! up to the answer and for none above, so the descent lands on it exactly.
//!
//! # Handing back
//! `tat' = max(now, tat - r × T)`: as if the lease had been `r` smaller. A bucket that has
//! refilled past the returned permits meanwhile is left alone (they are lost, not added: a
//! bucket is never fuller than full), and a key gone (expired, or a restart) stays gone.
//!
//! # Time
//! `now` is the server's `TIME`, unless the caller passes one (µs since its clock's origin):
//! a manual clock for tests and simulations, where every client of a key must pass the same
//! clock's time. Redis expires keys on its own clock, so a key written at a passed time gets
//! no TTL (it would expire in real time, handing a test a full bucket it never earned).

use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::Script;

use super::gcra::{ceil_duration, read_tat, split, Gcra};
use super::RedisLimitError;

/// What both scripts start with: effects replication, `now` (`ARGV[1]`, or the server's
/// `TIME`), the key's `tat` ([`read_tat`]), and `store`, which writes a `tat` with the expiry
/// rule of [`SCRIPT`](super::gcra::SCRIPT) (`PX` = the time until the bucket is full again,
/// `up` µs and `up_f` units, rounded up to whole ms) or, at a passed time, none.
macro_rules! prelude {
    () => {
        concat!(
            r#"
if redis.replicate_commands then redis.replicate_commands() end
local F = 1000000000000
local now = tonumber(ARGV[1])
local manual = now >= 0
if not manual then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function store(t_us, t_f, up, up_f)
  local value = string.format('%d.%012d', t_us, t_f)
  if manual then
    redis.call('SET', KEYS[1], value)
    return
  end
  if up_f > 0 then up = up + 1 end
  local ms = math.floor((up + 999) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', KEYS[1], value, 'PX', ms)
end
"#,
            read_tat!()
        )
    };
}

/// `KEYS[1]` the key; `ARGV` = `now` (µs, or `-1` for the server's `TIME`; a key written at
/// a passed time gets no TTL), `tau` (µs,
/// units), `need`, `want`, then `2^i × T` (µs, units) for `i = 0, 1, …` up to the highest
/// bit of `want`. Returns `{m, d_us, d_units}`: the permits granted (0 if fewer than `need`
/// fit) and `d` before the lease.
pub const LEASE_SCRIPT: &str = concat!(
    prelude!(),
    r#"
local tau_us, tau_f = tonumber(ARGV[2]), tonumber(ARGV[3])
local need, want = tonumber(ARGV[4]), tonumber(ARGV[5])
local d_us, d_f = 0, 0
if tat_us and tat_us >= now then
  d_us, d_f = tat_us - now, tat_f
end
local bits = (#ARGV - 5) / 2
local steps = {1}
for i = 2, bits do steps[i] = steps[i - 1] * 2 end
local m, a_us, a_f = 0, d_us, d_f
for i = bits, 1, -1 do
  if m + steps[i] <= want then
    local s_us, s_f = a_us + tonumber(ARGV[4 + 2 * i]), a_f + tonumber(ARGV[5 + 2 * i])
    if s_f >= F then
      s_us, s_f = s_us + 1, s_f - F
    end
    if s_us < tau_us or (s_us == tau_us and s_f <= tau_f) then
      m, a_us, a_f = m + steps[i], s_us, s_f
    end
  end
end
if m < need then
  return {0, d_us, d_f}
end
if m > 0 then
  store(now + a_us, a_f, a_us, a_f)
end
return {m, d_us, d_f}
"#
);

/// `KEYS[1]` the key; `ARGV` = `now` (as [`LEASE_SCRIPT`]'s), `r × T` (µs, units). Moves the
/// key's `tat` back by `r × T`, not below `now` (then the key, a full bucket, is deleted).
/// Returns 1 if the key changed, 0 if it was gone or already full.
pub const GIVE_BACK_SCRIPT: &str = concat!(
    prelude!(),
    r#"
if not tat_us or tat_us < now then return 0 end
local n_us, n_f = tat_us - tonumber(ARGV[2]), tat_f - tonumber(ARGV[3])
if n_f < 0 then
  n_us, n_f = n_us - 1, n_f + F
end
if n_us < now then
  redis.call('DEL', KEYS[1])
  return 1
end
store(n_us, n_f, n_us - now, n_f)
return 1
"#
);

/// What a lease call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseReply {
    /// Permits granted: 0 (refused), or between `need` and `want`.
    pub(super) granted: u32,
    /// How far the bucket was below full before the call, in units.
    d: u128,
    t: u128,
    tau: u128,
}

impl LeaseReply {
    /// How long after the call `n` permits could be had, nobody else taking any (zero if
    /// they could at once).
    pub(super) fn retry_after(&self, n: u32) -> Duration {
        ceil_duration((self.d + self.t * u128::from(n)).saturating_sub(self.tau))
    }
}

impl<C> Gcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Takes between `need` and `want` permits of `key` in one call (as many as the bucket
    /// has, up to `want`; none if fewer than `need`). `now_us`: the time in µs, or `None`
    /// for the server's. The caller ensures `need <= want <= burst` and a finite limit.
    pub(super) async fn lease_at(
        &self,
        key: &str,
        need: u32,
        want: u32,
        now_us: Option<u64>,
    ) -> Result<LeaseReply, RedisLimitError> {
        debug_assert!(need <= want && want <= self.burst() && self.t > 0);
        let (tau_us, tau_f) = split(self.tau);
        let mut call = LEASE.key(self.redis_key(key));
        call.arg(now_arg(now_us))
            .arg(tau_us)
            .arg(tau_f)
            .arg(need)
            .arg(want);
        let bits = u32::BITS - want.leading_zeros();
        for i in 0..bits {
            let (us, f) = split(self.t << i);
            call.arg(us).arg(f);
        }
        let reply: Vec<i64> = call.invoke_async(&mut self.con.clone()).await?;
        let bad = || RedisLimitError::UnexpectedReply(format!("{reply:?}"));
        let &[m, d_us, d_f] = reply.as_slice() else {
            return Err(bad());
        };
        let granted = u32::try_from(m).map_err(|_| bad())?;
        if (granted != 0 && granted < need)
            || granted > want
            || d_us < 0
            || !(0..super::gcra::UNITS_PER_US as i64).contains(&d_f)
        {
            return Err(bad());
        }
        Ok(LeaseReply {
            granted,
            d: d_us as u128 * super::gcra::UNITS_PER_US + d_f as u128,
            t: self.t,
            tau: self.tau,
        })
    }

    /// Hands `r` unspent permits of `key` back (`now_us` as [`Gcra::lease_at`]'s); `r` at
    /// most the burst.
    pub(super) async fn give_back_at(
        &self,
        key: &str,
        r: u32,
        now_us: Option<u64>,
    ) -> Result<(), RedisLimitError> {
        let (us, f) = split(self.t * u128::from(r));
        let _: i64 = GIVE_BACK
            .key(self.redis_key(key))
            .arg(now_arg(now_us))
            .arg(us)
            .arg(f)
            .invoke_async(&mut self.con.clone())
            .await?;
        Ok(())
    }
}

/// The scripts, hashed once.
static LEASE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| Script::new(LEASE_SCRIPT));
static GIVE_BACK: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(GIVE_BACK_SCRIPT));

/// The scripts' `now` argument: the time in µs, or -1 for the server's `TIME`.
fn now_arg(now_us: Option<u64>) -> i64 {
    now_us.map_or(-1, |us| i64::try_from(us).unwrap_or(i64::MAX))
}

//! Real `redis-server`s for the Redis tests: each test starts its own on a free loopback port,
//! with no persistence, and the handle stops it when dropped. Never port 6379, never a server
//! the test did not start.
//!
//! Without `redis-server` and `redis-cli` on the `PATH` a test is skipped: a line on stderr
//! (which libtest shows only for failing tests) and, when `TURNSTILE_REDIS_SKIPS` names a
//! file, a line appended to it, which `scripts/test` counts across every test binary for its
//! summary. With `TURNSTILE_REQUIRE_REDIS=1` (set by `.ci/run`) the test fails instead.
#![allow(dead_code)] // not every test binary uses every helper

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the Redis tests must run (`TURNSTILE_REQUIRE_REDIS=1`).
pub fn required() -> bool {
    std::env::var("TURNSTILE_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// Whether `redis-server` and `redis-cli` can be run here; if not, panics when Redis is
/// required and otherwise records that `test` is skipped ([`record_skip`]).
pub fn available(test: &str) -> bool {
    let runs = |program: &str| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing: Vec<&str> = ["redis-server", "redis-cli"]
        .into_iter()
        .filter(|p| !runs(p))
        .collect();
    if missing.is_empty() {
        return true;
    }
    let missing = missing.join(" and ");
    assert!(
        !required(),
        "{test}: {missing} not installed and TURNSTILE_REQUIRE_REDIS=1 \
         (apt-get install -y redis-server)"
    );
    record_skip(test, &missing);
    false
}

/// Says on stderr that `test` is skipped, and appends its name to the file that
/// `TURNSTILE_REDIS_SKIPS` names, if set: libtest hides a passing test's stderr, so the file
/// is how `scripts/test` counts the skips of every test binary. One `write` per line on a file
/// opened for appending, so lines from concurrent tests and binaries never interleave.
pub fn record_skip(test: &str, missing: &str) {
    eprintln!(
        "SKIPPED {test}: {missing} not installed (TURNSTILE_REQUIRE_REDIS=1 makes this a failure)"
    );
    let Some(path) = std::env::var_os("TURNSTILE_REDIS_SKIPS") else {
        return;
    };
    let line = format!("{test}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // A skip that cannot be counted must not pass unseen either.
    if let Err(e) = written {
        panic!("{test}: skipped, and TURNSTILE_REDIS_SKIPS={path:?} cannot record it: {e}");
    }
}

/// A free loopback port (not 6379): bind port 0, read the port, release it.
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().unwrap().port();
        // Cluster nodes also listen on port + 10000 (the bus port): keep both in range.
        if port != 6379 && port < 55_000 {
            return port;
        }
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A `redis-server` of this test's own.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port, or returns `None` (after saying so) when
    /// `redis-server` is missing and not required.
    pub fn start(test: &str) -> Option<RedisServer> {
        if !available(test) {
            return None;
        }
        Some(RedisServer::start_on_a_free_port(&[], false))
    }

    /// [`RedisServer::start`] with extra `redis-server` arguments.
    pub fn start_with(test: &str, extra: &[&str]) -> Option<RedisServer> {
        if !available(test) {
            return None;
        }
        Some(RedisServer::start_on_a_free_port(extra, false))
    }

    /// Starts a server with extra `redis-server` arguments on a port that was free a moment
    /// ago (and, for a cluster node, whose bus port, port + 10000, was too). Another process
    /// can take a port between that check and the server's bind (other tests' connections
    /// draw ephemeral ports from the same range): a server that exits instead of answering
    /// is started again on another port, up to 10 times.
    pub fn start_on_a_free_port(extra: &[&str], cluster: bool) -> RedisServer {
        for _ in 0..10 {
            let port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            if let Some(s) = RedisServer::try_start_on(port, extra) {
                return s;
            }
        }
        panic!("redis-server exited at start on 10 free ports in a row");
    }

    /// A server on `port` (`{port}` in `extra` stands for it), or `None` if it exits at start
    /// (the port is taken).
    pub fn try_start_on(port: u16, extra: &[&str]) -> Option<RedisServer> {
        let extra: Vec<String> = extra
            .iter()
            .map(|a| a.replace("{port}", &port.to_string()))
            .collect();
        let dir =
            std::env::temp_dir().join(format!("turnstile-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir for the server");
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            extra,
        };
        s.try_spawn().then_some(s)
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis-server on port {} exited at start",
            self.port
        );
    }

    /// Starts the process and waits until it answers PING: `false` if it exits first (its
    /// port was taken), a panic if it neither answers nor exits within 10 s.
    fn try_spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let mut exited = false;
        wait_until(
            Duration::from_secs(10),
            || {
                exited = self
                    .child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_some());
                exited || ping(self.port)
            },
            "redis-server to answer PING",
        );
        if exited {
            self.child = None;
        }
        !exited
    }

    /// The URL to connect to.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Stops the process (SIGSTOP): connections stay open and nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Continues a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Runs one command through `redis-cli` and returns its output (trimmed).
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// Runs `CONFIG SET name value`, asserting `OK`.
    pub fn config_set(&self, name: &str, value: &str) {
        let out = self.cli(&["config", "set", name, value]);
        assert_eq!(out, "OK", "CONFIG SET {name} {value}");
    }

    /// Runs a script that spins for `ms` milliseconds on the server's clock, from a raw
    /// client of its own on another thread, and waits until the server answers `BUSY` to
    /// others (set `busy-reply-threshold` below `ms` first). Join the handle to wait for the
    /// script's end.
    pub fn busy_for(&self, ms: u64) -> std::thread::JoinHandle<String> {
        const SPIN: &str = "local function us() local t = redis.call('TIME') \
            return tonumber(t[1]) * 1000000 + tonumber(t[2]) end \
            local stop = us() + tonumber(ARGV[1]) * 1000 \
            while us() < stop do end return 1";
        let port = self.port;
        let ms_arg = ms.to_string();
        let spin = std::thread::spawn(move || cli(port, &["eval", SPIN, "0", &ms_arg]));
        wait_until(
            Duration::from_secs(10),
            || cli(port, &["ping"]).starts_with("BUSY"),
            "the server to answer BUSY",
        );
        spin
    }

    /// Makes this server a replica of `primary` (`REPLICAOF`), and waits until it is
    /// connected to it (its writes then answer `READONLY`).
    pub fn replicate(&self, primary: &RedisServer) {
        // Redis 7 waits 5 s for more replicas before a diskless sync by default.
        primary.config_set("repl-diskless-sync-delay", "0");
        let port = primary.port.to_string();
        assert_eq!(self.cli(&["replicaof", "127.0.0.1", &port]), "OK");
        wait_until(
            Duration::from_secs(10),
            || {
                self.cli(&["info", "replication"])
                    .contains("master_link_status:up")
            },
            "the replica's link to its primary",
        );
    }

    /// Makes this server a primary again (`REPLICAOF NO ONE`).
    pub fn promote(&self) {
        assert_eq!(self.cli(&["replicaof", "no", "one"]), "OK");
    }
}

/// A TCP proxy on loopback that connects each new client to the server it points at now:
/// what a failover behind a DNS name or a virtual IP looks like to a client. Connections
/// already open stay on the server they were opened to.
pub struct Proxy {
    pub port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    /// A proxy to the server on `target`.
    pub fn to(target: u16) -> Proxy {
        use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let to = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let (to2, stop2) = (to.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", to2.load(Ordering::Relaxed)))
                else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy {
            port,
            target: to,
            stop,
        }
    }

    /// New connections go to the server on `target` from now on.
    pub fn point_at(&self, target: u16) {
        self.target
            .store(target, std::sync::atomic::Ordering::Relaxed);
    }

    /// The URL to connect to.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server must be continued to die cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` nodes (no replicas) on loopback, made by
/// `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the cluster, or returns `None` (after saying so) when `redis-server` is missing
    /// and not required.
    pub fn start(test: &str, masters: usize) -> Option<RedisCluster> {
        if !available(test) {
            return None;
        }
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_on_a_free_port(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes-{port}.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                    true,
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = RedisCluster { nodes };
        wait_until(
            Duration::from_secs(20),
            || {
                c.nodes
                    .iter()
                    .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
            },
            "the cluster to be ok on every node",
        );
        Some(c)
    }

    /// The nodes' URLs, for `redis::cluster::ClusterClient::new`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// `redis-cli -p port args...`, trimmed.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether a server on `port` answers `PING` with `PONG` within a second.
pub fn ping(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    let _ = s.shutdown(Shutdown::Both);
    buf[..n].starts_with(b"+PONG")
}

/// Polls `cond` every 20 ms until it holds, panicking after `limit` with `what`.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

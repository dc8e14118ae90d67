//! Test harness: starts the real `gridlinks` binary on a free loopback port with its own
//! data directory, and talks to it over real HTTP.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod mqtt;
pub mod pki;
pub mod rumqtt;
pub mod ws;

pub use serde_json::{json, Value as J};

pub const ADMIN_PASSWORD: &str = "test-password";
pub const SYSADMIN_PASSWORD: &str = "test-sysadmin-password";

pub struct Server {
    pub child: Child,
    pub base: String,
    /// MQTT port.
    pub mqtt_port: u16,
    /// MQTT over WebSocket port.
    pub ws_port: u16,
    /// CoAP (UDP) port.
    pub coap_port: u16,
    pub data_dir: PathBuf,
    agent: ureq::Agent,
    _tmp: Option<tempfile::TempDir>,
}

/// How long a test waits for something that should happen at once: a hang guard only,
/// generous enough for a busy 2-core machine running every test at the same time.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `done` every 20 ms until it holds; panics naming `what` after [`PATIENCE`].
/// For waiting on a condition instead of sleeping a guessed time.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free loopback port below Linux's ephemeral range (32768-60999), so that the many
/// client sockets of tests running in parallel cannot take it between this check and the
/// server's bind (port 0 would hand out exactly those ports).
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        let port = 10_000 + (h.finish() % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A free loopback UDP port, chosen like [`free_port`].
pub fn free_udp_port() -> u16 {
    loop {
        let port = free_port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Server {
    /// A server on a fresh data directory.
    pub fn start() -> Self {
        Self::start_env(&[])
    }

    /// A server on a fresh data directory, with extra environment variables.
    pub fn start_env(env: &[(&str, &str)]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let mut s = Self::start_on(&dir, env);
        s._tmp = Some(tmp);
        s
    }

    /// A server on `dir`, with extra environment variables. Started again on other ports
    /// if one was taken meanwhile by another test's server.
    pub fn start_on(dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_on_limited(dir, env, None)
    }

    /// A server on a fresh data directory whose process may open at most `nofile` files
    /// (RLIMIT_NOFILE, set with `prlimit`).
    pub fn start_with_nofile(env: &[(&str, &str)], nofile: u64) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Self::start_on_limited(&tmp.path().join("data"), env, Some(nofile));
        s._tmp = Some(tmp);
        s
    }

    fn start_on_limited(dir: &Path, env: &[(&str, &str)], nofile: Option<u64>) -> Self {
        Self::start_with(dir, env, nofile, None)
    }

    /// A server on `dir` whose log (stderr) goes to `log`.
    pub fn start_logged(dir: &Path, env: &[(&str, &str)], log: &Path) -> Self {
        Self::start_with(dir, env, None, Some(log))
    }

    fn start_with(dir: &Path, env: &[(&str, &str)], nofile: Option<u64>, log: Option<&Path>) -> Self {
        for _ in 0..5 {
            if let Some(s) = Self::try_start_on(dir, env, nofile, log) {
                return s;
            }
        }
        panic!("gridlinks did not start in 5 attempts");
    }

    fn try_start_on(dir: &Path, env: &[(&str, &str)], nofile: Option<u64>, log: Option<&Path>) -> Option<Self> {
        let port = free_port();
        let mqtt_port = free_port();
        let ws_port = free_port();
        let coap_port = free_udp_port();
        let mut cmd = match nofile {
            // prlimit execs the server, so the child's pid is the server's.
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}")).arg("--").arg(env!("CARGO_BIN_EXE_gridlinks"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_gridlinks")),
        };
        cmd.args(["serve", "--data-dir"])
            .arg(dir)
            .args(["--http-bind", &format!("127.0.0.1:{port}")])
            .args(["--mqtt-bind", &format!("127.0.0.1:{mqtt_port}")])
            .args(["--mqtt-ws-bind", &format!("127.0.0.1:{ws_port}")])
            .args(["--coap-bind", &format!("127.0.0.1:{coap_port}")])
            .env("GRIDLINKS_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .env("GRIDLINKS_ADMIN_SYSADMIN_PASSWORD", SYSADMIN_PASSWORD)
            .env("GRIDLINKS_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(match log {
                Some(path) => Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap()),
                None => Stdio::inherit(),
            });
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start gridlinks");
        let mut s = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            mqtt_port,
            ws_port,
            coap_port,
            data_dir: dir.to_owned(),
            agent: ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build(),
            _tmp: None,
        };
        s.wait_ready().then_some(s)
    }

    /// Waits for /healthz; false if the server exited first (e.g. a port was taken).
    pub fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if let Ok(r) = self.agent.get(&format!("{}/healthz", self.base)).call() {
                if r.status() == 200 {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("gridlinks did not become ready");
    }

    /// Any request; returns (status, body). `token` goes in `X-Authorization`.
    pub fn req(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
        let mut r = self.agent.request(method, &format!("{}{}", self.base, path));
        if let Some(t) = token {
            r = r.set("X-Authorization", &format!("Bearer {t}"));
        }
        r = r.set("Content-Type", "application/json");
        let res = match body {
            Some(b) => r.send_string(b),
            None => r.call(),
        };
        match res {
            Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    pub fn json(&self, method: &str, path: &str, token: &str, body: Option<J>) -> (u16, J) {
        let (s, b) = self.req(method, path, Some(token), body.map(|b| b.to_string()).as_deref());
        (s, serde_json::from_str(&b).unwrap_or(J::Null))
    }

    /// The first tenant's administrator's access token.
    pub fn login(&self) -> String {
        self.login_as("admin", ADMIN_PASSWORD)
    }

    /// The access token of `user`.
    pub fn login_as(&self, user: &str, password: &str) -> String {
        let (s, v) = self.try_login(user, password);
        assert_eq!(s, 200, "{v}");
        v["token"].as_str().unwrap().to_owned()
    }

    /// `POST /api/auth/login` as `user`: the status and the body. Password checks run at
    /// idle CPU priority: on a machine busy with other tests one may wait past its bound and
    /// be refused as busy (503), which says to retry; it is, for up to 60 s.
    pub fn try_login(&self, user: &str, password: &str) -> (u16, J) {
        let body = json!({"username": user, "password": password}).to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (s, b) = loop {
            let (s, b) = self.req("POST", "/api/auth/login", None, Some(&body));
            if s != 503 || Instant::now() > deadline {
                break (s, b);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        (s, serde_json::from_str(&b).unwrap_or(J::Null))
    }

    /// `POST /api/auth/token` with `refresh_token`: the status and the body.
    pub fn refresh(&self, refresh_token: &str) -> (u16, J) {
        let body = json!({"refreshToken": refresh_token}).to_string();
        let (s, b) = self.req("POST", "/api/auth/token", None, Some(&body));
        (s, serde_json::from_str(&b).unwrap_or(J::Null))
    }

    /// Creates a customer; returns its id.
    pub fn customer(&self, jwt: &str, title: &str) -> String {
        let (st, c) = self.json("POST", "/api/customer", jwt, Some(json!({"title": title})));
        assert_eq!(st, 200, "{c}");
        c["id"]["id"].as_str().unwrap().to_owned()
    }

    /// Creates a user (a tenant administrator, or a customer user of `customer`) and
    /// activates it with `password`; returns its id and access token.
    pub fn user(&self, jwt: &str, email: &str, customer: Option<&str>, password: &str) -> (String, String) {
        let authority = if customer.is_some() { "CUSTOMER_USER" } else { "TENANT_ADMIN" };
        let body = json!({"email": email, "authority": authority, "firstName": "Ann", "lastName": "Lee",
            "customerId": customer.map(|c| json!({"entityType": "CUSTOMER", "id": c}))});
        self.activated_user(jwt, body, password)
    }

    /// Creates the user `body` describes and activates it with `password`; returns its id
    /// and access token.
    pub fn activated_user(&self, jwt: &str, body: J, password: &str) -> (String, String) {
        let (st, u) = self.json("POST", "/api/user?sendActivationMail=false", jwt, Some(body));
        assert_eq!(st, 200, "{u}");
        let id = u["id"]["id"].as_str().unwrap().to_owned();
        let (st, link) = self.req("GET", &format!("/api/user/{id}/activationLink"), Some(jwt), None);
        assert_eq!(st, 200, "{link}");
        let token = link.split("activateToken=").nth(1).unwrap();
        let activate = json!({"activateToken": token, "password": password}).to_string();
        let (st, pair) = self.req("POST", "/api/noauth/activate?sendActivationMail=false", None, Some(&activate));
        assert_eq!(st, 200, "{pair}");
        let pair: J = serde_json::from_str(&pair).unwrap();
        (id, pair["token"].as_str().unwrap().to_owned())
    }

    /// Creates a device with the given token; returns its id.
    pub fn device(&self, jwt: &str, name: &str, token: &str) -> String {
        let (s, d) = self.json(
            "POST",
            &format!("/api/device?accessToken={token}"),
            jwt,
            Some(json!({"name": name, "type": "sensor"})),
        );
        assert_eq!(s, 200, "{d}");
        d["id"]["id"].as_str().unwrap().to_owned()
    }

    /// Creates a gateway device (`additionalInfo.gateway: true`) with the given token; returns its id.
    pub fn gateway(&self, jwt: &str, name: &str, token: &str) -> String {
        let body = json!({"name": name, "type": "gateway", "additionalInfo": {"gateway": true}});
        let (s, d) = self.json("POST", &format!("/api/device?accessToken={token}"), jwt, Some(body));
        assert_eq!(s, 200, "{d}");
        d["id"]["id"].as_str().unwrap().to_owned()
    }

    /// Every stored timestamp of `key` of device `id` (up to 100,000).
    pub fn stored_timestamps(&self, jwt: &str, id: &str, key: &str) -> std::collections::HashSet<i64> {
        let (st, v) = self.json(
            "GET",
            &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={key}&startTs=0&endTs=100000000&limit=100000"),
            jwt,
            None,
        );
        assert_eq!(st, 200, "{v}");
        v[key].as_array().map(|a| a.iter().map(|p| p["ts"].as_i64().unwrap()).collect()).unwrap_or_default()
    }

    /// Asserts that every acknowledged timestamp of `key` is stored, per device.
    pub fn assert_all_stored(&self, ids: &[String], acked: &[Vec<i64>], key: &str) {
        let jwt = self.login();
        for (id, acked) in ids.iter().zip(acked) {
            let stored = self.stored_timestamps(&jwt, id, key);
            let missing: Vec<_> = acked.iter().filter(|t| !stored.contains(t)).collect();
            assert!(
                missing.is_empty(),
                "device {id}: {} of {} acknowledged points lost, e.g. {:?}",
                missing.len(),
                acked.len(),
                &missing[..missing.len().min(5)]
            );
        }
    }

    pub fn telemetry(&self, token: &str, body: &str) -> u16 {
        self.req("POST", &format!("/api/v1/{token}/telemetry"), None, Some(body)).0
    }

    pub fn sigterm(&mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request an isolation sweep tries: route template, method, path, body.
pub type Tried = (&'static str, &'static str, String, Option<String>);

/// The device-data routes (telemetry, attributes, RPC) an isolation sweep tries on device
/// `d`.
pub fn device_data_routes(d: &str) -> Vec<Tried> {
    let t = format!("/api/plugins/telemetry/DEVICE/{d}");
    vec![
        ("{tel}/values/timeseries", "GET", format!("{t}/values/timeseries?keys=secret"), None),
        (
            "{tel}/values/timeseries/history",
            "GET",
            format!("{t}/values/timeseries/history?keys=secret&startTs=0&endTs=9999999999999"),
            None,
        ),
        ("{tel}/keys/timeseries", "GET", format!("{t}/keys/timeseries"), None),
        ("{tel}/keys/attributes", "GET", format!("{t}/keys/attributes"), None),
        ("{tel}/keys/attributes/{scope}", "GET", format!("{t}/keys/attributes/SHARED_SCOPE"), None),
        ("{tel}/values/attributes", "GET", format!("{t}/values/attributes"), None),
        ("{tel}/values/attributes/{scope}", "GET", format!("{t}/values/attributes/SHARED_SCOPE"), None),
        ("{tel}/attributes/{scope}", "POST", format!("{t}/attributes/SHARED_SCOPE"), Some(r#"{"x":1}"#.into())),
        (
            "{tel}/timeseries/delete",
            "DELETE",
            format!("{t}/timeseries/delete?keys=secret&deleteAllDataForKeys=true"),
            None,
        ),
        ("{tel}/timeseries/{scope}", "POST", format!("{t}/timeseries/ANY"), Some(r#"{"x":1}"#.into())),
        ("{tel}/{scope}", "DELETE", format!("{t}/SHARED_SCOPE?keys=attr"), None),
        ("{tel}/{scope}", "POST", format!("{t}/SHARED_SCOPE"), Some(r#"{"x":1}"#.into())),
        ("{tel}", "POST", format!("/api/plugins/telemetry/{d}/SHARED_SCOPE"), Some(r#"{"x":1}"#.into())),
        ("{tel}", "DELETE", format!("/api/plugins/telemetry/{d}/SHARED_SCOPE?keys=attr"), None),
        (
            "/api/plugins/rpc/{kind}/{device_id}",
            "POST",
            format!("/api/plugins/rpc/oneway/{d}"),
            Some(r#"{"method":"m"}"#.into()),
        ),
        ("/api/rpc/{kind}/{device_id}", "POST", format!("/api/rpc/twoway/{d}"), Some(r#"{"method":"m"}"#.into())),
    ]
}

/// Routes open to anyone (device API, login, health) or about the caller itself: the
/// isolation sweeps do not try them with another's ids.
pub const OPEN_ROUTES: &[&str] = &[
    // The web console's files: the same for everyone, no data.
    "/",
    "/assets/{file}",
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/auth/login",
    "/api/auth/token",
    "/api/auth/logout",
    "/api/auth/user",
    "/api/auth/changePassword",
    "/api/noauth/activate",
    "/api/ruleChains",
    "/api/ruleChain",
    "/api/ruleChain/{*rest}",
    // The same list for everyone.
    "/api/notification/deliveryMethods",
    // 501 for everyone: ThingsBoard 4.3's alarm rules as calculated fields.
    "/api/alarm/rule",
    "/api/alarm/rule/{*rest}",
    "/api/alarm/rules",
    "/api/alarm/rules/{*rest}",
    "/api/ruleNode/{*rest}",
    // What the caller may see, and nothing else: tests/assets_relations.rs checks each
    // answers a customer user with its own customer's entities only.
    "/api/user/assets",
    "/api/entitiesQuery/find",
    "/api/entitiesQuery/count",
    "/api/entitiesQuery/find/keys",
    "/api/v2/entitiesQuery/find/keys",
    "/api/dashboards",
    // The server's clock and read bound: no data.
    "/api/dashboard/serverTime",
    "/api/dashboard/maxDatapointsLimit",
    "/api/v1/provision",
    // The device API: `{d}` is `/api/v1/{token}` and, with http.tls_client_certs, `/api/v1`
    // (the client certificate names the device: tests/tls.rs).
    "{d}/telemetry",
    "{d}/attributes",
    "{d}/claim",
    "{d}/attributes/updates",
    "{d}/rpc",
    "{d}/rpc/{request_id}",
    "{d}/firmware",
    "{d}/software",
    // Authenticated inside the protocol, each subscription checked: tests/websocket.rs.
    "/api/ws",
    "/api/ws/plugins/telemetry",
];

/// The REST routes the server declares, read from its source (`{tel}` stands for the
/// telemetry prefix `/api/plugins/telemetry/{entity_type}/{id}`).
pub fn server_routes() -> Vec<String> {
    let src = include_str!("../../../gridlinks-http/src/app.rs");
    let state = include_str!("../../../gridlinks-http/src/state.rs");
    let mut out = Vec::new();
    for part in src.split(".route(").skip(1) {
        let part = part.trim_start();
        let route = if let Some(rest) = part.strip_prefix('"') {
            rest.split('"').next().unwrap().to_owned()
        } else if let Some(rest) = part.strip_prefix("&format!(\"") {
            rest.split('"').next().unwrap().replace("{{", "{").replace("}}", "}")
        } else if part.starts_with("tel,") {
            "{tel}".to_owned()
        } else if let Some(name) =
            part.split(',').next().filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        {
            // A path constant of the HTTP transport's state.
            let def = state.split(&format!("const {name}: &str = \"")).nth(1).expect("the path constant's definition");
            def.split('"').next().unwrap().to_owned()
        } else {
            panic!("cannot read route: {}", &part[..40.min(part.len())]);
        };
        out.push(route);
    }
    assert!(out.len() > 60, "{out:?}");
    out
}

/// Reads one HTTP response head (and whatever came with it) from a raw connection.
pub fn response_head(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Server {
    /// Sends `request` (raw bytes, as written) on a new connection to the HTTP port and
    /// returns the response head.
    pub fn raw_http(&self, request: &str) -> String {
        let mut c = std::net::TcpStream::connect(self.base.trim_start_matches("http://")).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        std::io::Write::write_all(&mut c, request.as_bytes()).unwrap();
        response_head(&mut c)
    }
}

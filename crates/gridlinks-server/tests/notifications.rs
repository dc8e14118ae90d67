//! The notification center on the real binary: targets, templates and rules in
//! ThingsBoard's shapes; an alarm notifies a tenant administrator's inbox, a signed webhook
//! and a Slack-compatible webhook (real HTTP receivers on loopback); a receiver that fails
//! is retried, a dead one is logged as failed in the delivery log; device activity notifies;
//! bad input is refused on save; webhooks to private addresses are refused unless allowed.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::*;

/// A request a receiver got: its path, headers (lower-case names) and body.
#[derive(Clone, Debug)]
struct Got {
    path: String,
    headers: Vec<(String, String)>,
    body: J,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP receiver on loopback: answers 500 to its first `failures` requests, then 200;
/// keeps every request.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(failures: usize) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let keep = got.clone();
        std::thread::spawn(move || {
            for (n, conn) in l.incoming().enumerate() {
                let Ok(mut conn) = conn else { continue };
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap();
                    headers.push((k.trim().to_lowercase(), v.trim().to_owned()));
                }
                let len: usize =
                    headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                keep.lock().unwrap().push(Got {
                    path,
                    headers,
                    body: serde_json::from_slice(&body).unwrap_or(J::Null),
                });
                let status = if n < failures { "500 Internal Server Error" } else { "200 OK" };
                let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            }
        });
        Self { url, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

fn hmac_hex(key: &str, parts: &[&[u8]]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn save(s: &Server, jwt: &str, what: &str, body: J) -> String {
    let (st, v) = s.json("POST", &format!("/api/notification/{what}"), jwt, Some(body));
    assert_eq!(st, 200, "{what}: {v}");
    v["id"]["id"].as_str().unwrap().to_owned()
}

fn target(s: &Server, jwt: &str, name: &str, configuration: J) -> String {
    save(s, jwt, "target", json!({"name": name, "configuration": configuration}))
}

fn template(s: &Server, jwt: &str, name: &str, kind: &str, methods: J) -> String {
    save(
        s,
        jwt,
        "template",
        json!({"name": name, "notificationType": kind,
        "configuration": {"deliveryMethodsTemplates": methods}}),
    )
}

fn requests(s: &Server, jwt: &str) -> Vec<J> {
    let (_, page) = s.json("GET", "/api/notification/requests?pageSize=100&page=0", jwt, None);
    page["data"].as_array().unwrap().clone()
}

/// The deliveries of every request of `rule`.
fn deliveries(s: &Server, jwt: &str, rule: &str) -> Vec<J> {
    requests(s, jwt)
        .into_iter()
        .filter(|r| r["ruleId"] == rule)
        .flat_map(|r| r["deliveries"].as_array().unwrap().clone())
        .collect()
}

const ENV: [(&str, &str); 5] = [
    ("GRIDLINKS_NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES", "true"),
    ("GRIDLINKS_NOTIFICATIONS_RETRY_DELAY", "100"),
    ("GRIDLINKS_NOTIFICATIONS_MAX_ATTEMPTS", "3"),
    ("GRIDLINKS_ACTIVITY_INACTIVITY_TIMEOUT", "1500"),
    ("GRIDLINKS_ACTIVITY_CHECK_INTERVAL", "200"),
];

#[test]
fn an_alarm_notifies_the_inbox_and_webhooks_with_retries_and_a_delivery_log() {
    let s = Server::start_env(&ENV);
    let jwt = s.login();
    let hook = Receiver::start(2);
    let slack = Receiver::start(0);
    let webhook = target(
        &s,
        &jwt,
        "ops webhook",
        json!({"type": "WEBHOOK", "url": format!("{}/hook", hook.url), "secret": "s3cret"}),
    );
    let slack_t = target(&s, &jwt, "ops slack", json!({"type": "SLACK", "webhookUrl": format!("{}/slack", slack.url)}));
    let admins =
        target(&s, &jwt, "admins", json!({"type": "PLATFORM_USERS", "usersFilter": {"type": "TENANT_ADMINISTRATORS"}}));
    let text = "${alarmOriginatorName}: ${alarmType} is ${alarmSeverity} (${action}) ${details.where}";
    let tpl = template(
        &s,
        &jwt,
        "alarm text",
        "ALARM",
        json!({
        "WEB": {"enabled": true, "subject": "${alarmType}", "body": text},
        "WEBHOOK": {"enabled": true, "subject": "${alarmType}", "body": text},
        "SLACK": {"enabled": true, "body": text}}),
    );
    let rule = save(
        &s,
        &jwt,
        "rule",
        json!({"name": "leaks", "enabled": true, "templateId": {"entityType": "NOTIFICATION_TEMPLATE", "id": tpl},
        "triggerType": "ALARM",
        "triggerConfig": {"triggerType": "ALARM", "alarmTypes": ["Leak"], "notifyOn": ["CREATED", "CLEARED"]},
        "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [webhook, slack_t, admins]}}}),
    );
    // The secret is write-only.
    let (_, back) = s.json("GET", &format!("/api/notification/target/{webhook}"), &jwt, None);
    assert!(back["configuration"].get("secret").is_none() && back["configuration"]["secretSet"] == true, "{back}");

    let dev = s.device(&jwt, "cellar-meter", "cellar-meter-token");
    let alarm = json!({"originator": {"entityType": "DEVICE", "id": dev}, "type": "Leak", "severity": "MAJOR", "details": {"where": "cellar"}});
    let (st, a) = s.json("POST", "/api/alarm", &jwt, Some(alarm));
    assert_eq!(st, 200, "{a}");
    let other = json!({"originator": {"entityType": "DEVICE", "id": dev}, "type": "Tamper", "severity": "MAJOR"});
    assert_eq!(s.json("POST", "/api/alarm", &jwt, Some(other)).0, 200);

    // The webhook failed twice and got it the third time, signed; Slack at once.
    wait_until("the webhook delivery", || hook.got().len() == 3);
    let last = hook.got().pop().unwrap();
    assert_eq!(last.path, "/hook");
    assert_eq!(last.body["text"], "cellar-meter: Leak is major (created) cellar", "{:?}", last.body);
    assert_eq!(last.body["info"]["alarmType"], "Leak");
    let ts = last.header("x-gridlinks-timestamp").unwrap().to_owned();
    let raw = serde_json::to_vec(&last.body).unwrap();
    let want = format!("sha256={}", hmac_hex("s3cret", &[ts.as_bytes(), b".", &raw]));
    assert_eq!(last.header("x-gridlinks-signature"), Some(want.as_str()));
    wait_until("the slack delivery", || slack.got().len() == 1);
    assert_eq!(slack.got()[0].body, json!({"text": "cellar-meter: Leak is major (created) cellar"}));

    // The administrator's inbox, read and unread.
    wait_until("the inbox", || s.json("GET", "/api/notifications/unread/count", &jwt, None).1 == 1);
    let (_, inbox) = s.json("GET", "/api/notifications?pageSize=10&page=0", &jwt, None);
    let n = &inbox["data"][0];
    assert_eq!(
        (n["subject"].as_str(), n["status"].as_str(), n["deliveryMethod"].as_str()),
        (Some("Leak"), Some("SENT"), Some("WEB")),
        "{inbox}"
    );
    let nid = n["id"]["id"].as_str().unwrap();
    assert_eq!(s.req("PUT", &format!("/api/notification/{nid}/read"), Some(&jwt), None).0, 200);
    assert_eq!(s.json("GET", "/api/notifications/unread/count", &jwt, None).1, 0);

    // The delivery log: each delivery, its attempts and outcome; Tamper matched no rule.
    wait_until("the request ends", || requests(&s, &jwt).iter().all(|r| r["status"] == "SENT"));
    let log = deliveries(&s, &jwt, &rule);
    let by = |m: &str| log.iter().find(|d| d["method"] == m).unwrap().clone();
    assert_eq!(
        (by("WEBHOOK")["status"].as_str(), by("WEBHOOK")["attempts"].as_u64()),
        (Some("SENT"), Some(3)),
        "{log:?}"
    );
    assert!(by("WEBHOOK")["lastError"].as_str().unwrap().contains("500"), "{log:?}");
    assert_eq!((by("SLACK")["status"].as_str(), by("WEB")["status"].as_str()), (Some("SENT"), Some("SENT")));
    assert_eq!(requests(&s, &jwt).len(), 1);

    // Cleared: notified again (CLEARED is in notifyOn); acknowledged: not.
    let id = a["id"]["id"].as_str().unwrap();
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/ack"), &jwt, None).0, 200);
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/clear"), &jwt, None).0, 200);
    wait_until("the clear notification", || slack.got().len() == 2);
    assert_eq!(slack.got()[1].body["text"], "cellar-meter: Leak is major (cleared) cellar");
    assert_eq!(requests(&s, &jwt).len(), 2, "the acknowledgement notified nobody");

    // A receiver that is gone: tried max_attempts times, then logged as failed.
    let dead = format!("http://127.0.0.1:{}/gone", free_port());
    let gone = target(&s, &jwt, "gone", json!({"type": "WEBHOOK", "url": dead}));
    let rule2 = save(
        &s,
        &jwt,
        "rule",
        json!({"name": "to nowhere", "templateId": {"id": tpl}, "triggerType": "ALARM",
        "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
        "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [gone]}}}),
    );
    let third = json!({"originator": {"entityType": "DEVICE", "id": dev}, "type": "Flood", "severity": "CRITICAL"});
    assert_eq!(s.json("POST", "/api/alarm", &jwt, Some(third)).0, 200);
    wait_until("the failed delivery", || deliveries(&s, &jwt, &rule2).iter().any(|d| d["status"] == "FAILED"));
    let failed = deliveries(&s, &jwt, &rule2).pop().unwrap();
    assert_eq!(failed["attempts"], 3, "{failed}");
    assert!(!failed["lastError"].as_str().unwrap().is_empty());

    // In use: a target or template a rule names cannot be deleted.
    let (st, e) = s.json("DELETE", &format!("/api/notification/target/{gone}"), &jwt, None);
    assert_eq!(st, 400, "{e}");
    assert_eq!(s.req("DELETE", &format!("/api/notification/rule/{rule2}"), Some(&jwt), None).0, 200);
    assert_eq!(s.req("DELETE", &format!("/api/notification/target/{gone}"), Some(&jwt), None).0, 200);
}

#[test]
fn device_activity_notifies_and_bad_input_is_refused_on_save() {
    let s = Server::start_env(&ENV);
    let jwt = s.login();
    let hook = Receiver::start(0);
    let t = target(&s, &jwt, "hook", json!({"type": "WEBHOOK", "url": hook.url}));
    let tpl = template(
        &s,
        &jwt,
        "activity",
        "DEVICE_ACTIVITY",
        json!({
        "WEBHOOK": {"enabled": true, "body": "${deviceName} is ${eventType}"}}),
    );
    save(
        &s,
        &jwt,
        "rule",
        json!({"name": "silence", "templateId": {"id": tpl}, "triggerType": "DEVICE_ACTIVITY",
        "triggerConfig": {"triggerType": "DEVICE_ACTIVITY", "notifyOn": ["INACTIVE", "ACTIVE"]},
        "recipientsConfig": {"triggerType": "DEVICE_ACTIVITY", "targets": [t]}}),
    );
    s.device(&jwt, "quiet-one", "quiet-one-token");
    assert_eq!(s.telemetry("quiet-one-token", r#"{"t":1}"#), 200);
    wait_until("active, then inactive", || hook.got().len() >= 2);
    let texts: Vec<J> = hook.got().iter().map(|g| g.body["text"].clone()).collect();
    assert_eq!(texts[..2], [json!("quiet-one is active"), json!("quiet-one is inactive")], "{texts:?}");

    // Refused on save, each with what is wrong.
    let bad = [
        (
            "template",
            json!({"name": "t", "notificationType": "ALARM", "configuration": {"deliveryMethodsTemplates": {
            "WEB": {"enabled": true, "subject": "s", "body": "${temperature}"}}}}),
            "unknown field ${temperature}",
        ),
        (
            "template",
            json!({"name": "t", "notificationType": "ALARM", "configuration": {"deliveryMethodsTemplates": {
            "SMS": {"enabled": true, "body": "x"}}}}),
            "delivery method \"SMS\"",
        ),
        ("target", json!({"name": "x", "configuration": {"type": "WEBHOOK", "url": "ftp://x"}}), "http(s) URL"),
        (
            "target",
            json!({"name": "x", "configuration": {"type": "PLATFORM_USERS", "usersFilter": {"type": "USER_LIST",
            "usersIds": ["00000000-0000-4000-8000-000000000001"]}}}),
            "is not found",
        ),
        (
            "rule",
            json!({"name": "r", "templateId": {"id": tpl}, "triggerType": "ALARM",
            "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
            "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"soon": [t]}}}),
            "delays in seconds",
        ),
        (
            "rule",
            json!({"name": "r", "templateId": {"id": tpl}, "triggerType": "ALARM",
            "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
            "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [t]}}}),
            "not a ALARM template",
        ),
    ];
    for (what, body, want) in bad {
        let (st, e) = s.json("POST", &format!("/api/notification/{what}"), &jwt, Some(body));
        assert!(st == 400 || st == 404, "{what}: {st} {e}");
        assert!(e["message"].as_str().unwrap().contains(want), "{e} should say {want}");
    }

    // Another tenant sees none of it and cannot use it.
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (_, beta) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    let admin = json!({"email": "beta@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": beta["id"]["id"]}});
    let (_, beta_jwt) = s.activated_user(&sys, admin, "beta-password-1");
    assert_eq!(s.json("GET", &format!("/api/notification/target/{t}"), &beta_jwt, None).0, 404);
    let steal = json!({"name": "r", "templateId": {"id": tpl}, "triggerType": "DEVICE_ACTIVITY",
        "triggerConfig": {"triggerType": "DEVICE_ACTIVITY", "notifyOn": ["ACTIVE"]},
        "recipientsConfig": {"triggerType": "DEVICE_ACTIVITY", "targets": [t]}});
    assert_eq!(s.json("POST", "/api/notification/rule", &beta_jwt, Some(steal)).0, 404);
    let (_, lists) = s.json("GET", "/api/notification/targets?pageSize=10&page=0", &beta_jwt, None);
    assert_eq!(lists["totalElements"], 0);
}

#[test]
fn webhooks_to_private_addresses_are_refused_unless_allowed() {
    let s = Server::start_env(&[
        ("GRIDLINKS_NOTIFICATIONS_RETRY_DELAY", "50"),
        ("GRIDLINKS_NOTIFICATIONS_MAX_ATTEMPTS", "1"),
    ]);
    let jwt = s.login();
    let hook = Receiver::start(0);
    let t = target(&s, &jwt, "inside", json!({"type": "WEBHOOK", "url": hook.url}));
    let tpl = template(&s, &jwt, "t", "ALARM", json!({"WEBHOOK": {"enabled": true, "body": "${alarmType}"}}));
    let rule = save(
        &s,
        &jwt,
        "rule",
        json!({"name": "r", "templateId": {"id": tpl}, "triggerType": "ALARM",
        "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
        "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [t]}}}),
    );
    let dev = s.device(&jwt, "d", "d-token");
    let a = json!({"originator": {"entityType": "DEVICE", "id": dev}, "type": "Probe", "severity": "MINOR"});
    assert_eq!(s.json("POST", "/api/alarm", &jwt, Some(a)).0, 200);
    wait_until("the refusal", || deliveries(&s, &jwt, &rule).iter().any(|d| d["status"] == "FAILED"));
    let d = deliveries(&s, &jwt, &rule).pop().unwrap();
    assert!(d["lastError"].as_str().unwrap().contains("allow_private_addresses"), "{d}");
    assert!(hook.got().is_empty(), "nothing reached the loopback receiver");
}

/// An escalation table: the first step at once, a later one after its delay, unless the
/// rule's clearRule statuses (here: acknowledged) ended the escalation; the delivery log
/// says which.
#[test]
fn escalation_steps_wait_their_delay_and_stop_at_the_clear_rule() {
    let s = Server::start_env(&ENV);
    let jwt = s.login();
    let (first, second) = (Receiver::start(0), Receiver::start(0));
    let t1 = target(&s, &jwt, "first", json!({"type": "WEBHOOK", "url": first.url}));
    let t2 = target(&s, &jwt, "second", json!({"type": "WEBHOOK", "url": second.url}));
    let tpl = template(&s, &jwt, "t", "ALARM", json!({"WEBHOOK": {"enabled": true, "body": "${alarmType}"}}));
    let rule = |name: &str, types: J, later: &str| {
        save(
            &s,
            &jwt,
            "rule",
            json!({"name": name, "templateId": {"id": tpl}, "triggerType": "ALARM",
            "triggerConfig": {"triggerType": "ALARM", "alarmTypes": types, "notifyOn": ["CREATED"],
                "clearRule": {"alarmStatuses": ["ACK"]}},
            "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [t1], later: [t2]}}}),
        )
    };
    let (soon, late) = (rule("soon", json!(["Smoke"]), "1"), rule("late", json!(["Steam"]), "8"));
    let dev = s.device(&jwt, "esc", "esc-token");
    let raise = |ty: &str| {
        let body = json!({"originator": {"entityType": "DEVICE", "id": dev}, "type": ty, "severity": "MAJOR"});
        let (st, a) = s.json("POST", "/api/alarm", &jwt, Some(body));
        assert_eq!(st, 200, "{a}");
        a["id"]["id"].as_str().unwrap().to_owned()
    };
    raise("Smoke");
    let steam = raise("Steam");
    assert_eq!(s.json("POST", &format!("/api/alarm/{steam}/ack"), &jwt, None).0, 200);
    wait_until("both first steps", || first.got().len() == 2);
    // Smoke's second step comes after its delay; Steam's is cancelled: acknowledged.
    wait_until("Smoke's second step", || second.got().len() == 1);
    assert_eq!(second.got()[0].body["text"], "Smoke");
    wait_until("Steam's second step is decided", || {
        deliveries(&s, &jwt, &late).iter().all(|d| d["status"] != "PENDING")
    });
    let steps = deliveries(&s, &jwt, &late);
    let cancelled = steps.iter().find(|d| d["status"] == "CANCELLED").unwrap();
    assert!(cancelled["lastError"].as_str().unwrap().contains("ACTIVE_ACK"), "{steps:?}");
    assert_eq!(second.got().len(), 1, "nothing more reached the second step's receiver");
    assert!(deliveries(&s, &jwt, &soon).iter().all(|d| d["status"] == "SENT"));
}

//! OTA packages tried as an attacker would: a device gets only the package assigned to it
//! (never another profile's, whatever it names), chunk sizes and indexes that are negative,
//! huge or garbage get clear errors, unknown packages are 404, another tenant's packages do
//! not exist for it, and a package cannot be assigned across profiles or types. Raw MQTT 5
//! and HTTP against the real binary.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

/// Uploads `data` as the raw body (no multipart) and returns the package's JSON.
fn package(s: &Server, jwt: &str, profile: &str, title: &str, t: &str, data: &[u8]) -> J {
    let body = json!({"title": title, "version": "1.0", "type": t,
        "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}});
    let (st, info) = s.json("POST", "/api/otaPackage", jwt, Some(body));
    assert_eq!(st, 200, "{info}");
    let id = info["id"]["id"].as_str().unwrap();
    let r = ureq::post(&format!("{}/api/otaPackage/{id}?checksumAlgorithm=SHA256", s.base))
        .set("X-Authorization", &format!("Bearer {jwt}"))
        .set("Content-Type", "application/octet-stream")
        .send_bytes(data)
        .unwrap();
    r.into_json().unwrap()
}

fn profile(s: &Server, jwt: &str, name: &str) -> String {
    let (st, p) = s.json("POST", "/api/deviceProfile", jwt, Some(json!({"name": name, "type": "DEFAULT"})));
    assert_eq!(st, 200, "{p}");
    p["id"]["id"].as_str().unwrap().to_owned()
}

fn assign(s: &Server, jwt: &str, profile: &str, field: &str, package: &J) -> (u16, J) {
    let (_, mut doc) = s.json("GET", &format!("/api/deviceProfile/{profile}"), jwt, None);
    doc[field] = package["id"].clone();
    s.json("POST", "/api/deviceProfile", jwt, Some(doc))
}

fn device_of(s: &Server, jwt: &str, name: &str, token: &str, profile: &str) -> String {
    let body = json!({"name": name, "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}});
    let (st, d) = s.json("POST", &format!("/api/device?accessToken={token}"), jwt, Some(body));
    assert_eq!(st, 200, "{d}");
    d["id"]["id"].as_str().unwrap().to_owned()
}

fn get_bytes(s: &Server, path: &str) -> (u16, Vec<u8>) {
    match ureq::get(&format!("{}{path}", s.base)).call() {
        Ok(r) => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut r.into_reader(), &mut out).unwrap();
            (200, out)
        }
        Err(ureq::Error::Status(code, _)) => (code, Vec::new()),
        Err(e) => panic!("{path}: {e}"),
    }
}

#[test]
fn a_device_gets_only_its_own_package_and_bad_chunk_requests_are_refused() {
    let s = Server::start();
    let jwt = s.login();
    let (pa, pb) = (profile(&s, &jwt, "meters"), profile(&s, &jwt, "valves"));
    let data_a: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
    let fw_a = package(&s, &jwt, &pa, "meter-fw", "FIRMWARE", &data_a);
    let fw_b = package(&s, &jwt, &pb, "valve-fw", "FIRMWARE", b"valve secret firmware");
    assert_eq!(fw_a["dataSize"], 2500);
    assert_eq!(fw_a["checksum"].as_str().unwrap().len(), 64);

    // Assignment is checked: another profile's package, or the wrong type, is refused.
    assert_eq!(assign(&s, &jwt, &pa, "firmwareId", &fw_b).0, 400);
    assert_eq!(assign(&s, &jwt, &pa, "softwareId", &fw_a).0, 400);
    assert_eq!(assign(&s, &jwt, &pa, "firmwareId", &fw_a).0, 200);
    assert_eq!(assign(&s, &jwt, &pb, "firmwareId", &fw_b).0, 200);
    device_of(&s, &jwt, "meter-1", "METER1", &pa);
    let default = s.json("GET", "/api/deviceProfileInfo/default", &jwt, None).1;
    device_of(&s, &jwt, "plain-1", "PLAIN1", default["id"]["id"].as_str().unwrap());

    // HTTP: chunks of the device's own package; naming another package is 400; no package 404.
    let fw = "/api/v1/METER1/firmware?title=meter-fw&version=1.0";
    assert_eq!(get_bytes(&s, &format!("{fw}&size=1000&chunk=2")), (200, data_a[2000..].to_vec()));
    assert_eq!(get_bytes(&s, &format!("{fw}&size=1000&chunk=3")), (200, Vec::new()), "past the end: empty");
    assert_eq!(get_bytes(&s, fw), (200, data_a.clone()), "no size: the whole package");
    assert_eq!(get_bytes(&s, "/api/v1/METER1/firmware?title=valve-fw&version=1.0").0, 400);
    assert_eq!(get_bytes(&s, "/api/v1/PLAIN1/firmware?title=valve-fw&version=1.0").0, 404);
    assert_eq!(get_bytes(&s, "/api/v1/METER1/software?title=meter-fw&version=1.0").0, 404);
    assert_eq!(get_bytes(&s, "/api/v1/NOPE/firmware?title=meter-fw&version=1.0").0, 401);
    for bad in ["&size=-1", "&chunk=-3", "&size=abc", "&size=99999999999999999999"] {
        assert_eq!(get_bytes(&s, &format!("{fw}{bad}")).0, 400, "{bad}");
    }

    // MQTT: the same rules; a garbage or negative size is a payload error, nothing sent.
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("METER1"), 60);
    c.publish("v2/fw/request/7/chunk/1", b"1000", QoS::AtLeastOnce, Some(1));
    let mut got = None;
    for _ in 0..2 {
        match c.recv() {
            Some(Packet::Publish(p)) => got = Some((p.topic, p.payload.to_vec())),
            Some(Packet::PubAck(a)) => assert_eq!(a.reason, 0),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, Some(("v2/fw/response/7/chunk/1".to_owned(), data_a[1000..2000].to_vec())));
    for (pid, size) in [(2, &b"-5"[..]), (3, b"lots"), (4, b"99999999999")] {
        c.publish("v2/fw/request/8/chunk/0", size, QoS::AtLeastOnce, Some(pid));
        match c.recv() {
            Some(Packet::PubAck(a)) => assert_eq!(a.reason, reason::PAYLOAD_FORMAT_INVALID, "{size:?}"),
            other => panic!("{other:?}"),
        }
    }
    let (mut plain, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("PLAIN1"), 60);
    plain.publish("v2/fw/request/1/chunk/0", b"", QoS::AtLeastOnce, Some(1));
    match plain.recv() {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, reason::PAYLOAD_FORMAT_INVALID),
        other => panic!("a device with no package gets nothing: {other:?}"),
    }

    // The REST API: unknown ids are 404, another tenant sees nothing, a package in use
    // stays, and a second upload is refused.
    let unknown = "5b1e2c3d-0000-4000-8000-000000000000";
    assert_eq!(s.req("GET", &format!("/api/otaPackage/info/{unknown}"), Some(&jwt), None).0, 404);
    assert_eq!(s.req("DELETE", &format!("/api/otaPackage/{unknown}"), Some(&jwt), None).0, 404);
    let id_a = fw_a["id"]["id"].as_str().unwrap();
    assert_eq!(s.req("DELETE", &format!("/api/otaPackage/{id_a}"), Some(&jwt), None).0, 400);
    let again = ureq::post(&format!("{}/api/otaPackage/{id_a}?checksumAlgorithm=SHA256", s.base))
        .set("X-Authorization", &format!("Bearer {jwt}"))
        .send_bytes(b"other");
    assert!(matches!(again, Err(ureq::Error::Status(400, _))));
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (st, t) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    assert_eq!(st, 200, "{t}");
    let body = json!({"email": "admin@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": t["id"]["id"]}});
    let beta = s.activated_user(&sys, body, "beta-secret").1;
    assert_eq!(s.req("GET", &format!("/api/otaPackage/info/{id_a}"), Some(&beta), None).0, 404);
    assert_eq!(s.req("GET", &format!("/api/otaPackage/{id_a}/download"), Some(&beta), None).0, 404);
    let (st, page) = s.json("GET", "/api/otaPackages?pageSize=10&page=0", &beta, None);
    assert_eq!((st, page["totalElements"].as_u64()), (200, Some(0)));
}

/// A device made another way than a REST save — provisioned, created by its gateway, or
/// imported — in a profile with firmware gets the package's `fw_*` shared attributes, as a
/// saved device does.
#[test]
fn devices_made_by_provisioning_gateways_and_imports_get_their_profiles_package() {
    let s = Server::start();
    let jwt = s.login();
    let prof = profile(&s, &jwt, "fleet");
    let fw = package(&s, &jwt, &prof, "fleet-fw", "FIRMWARE", b"firmware bytes");
    assert_eq!(assign(&s, &jwt, &prof, "firmwareId", &fw).0, 200);
    let (_, mut doc) = s.json("GET", &format!("/api/deviceProfile/{prof}"), &jwt, None);
    doc["provisionType"] = json!("ALLOW_CREATE_NEW_DEVICES");
    doc["provisionDeviceKey"] = json!("fleet-key");
    doc["profileData"]["provisionConfiguration"] =
        json!({"type": "ALLOW_CREATE_NEW_DEVICES", "provisionDeviceSecret": "fleet-secret"});
    assert_eq!(s.json("POST", "/api/deviceProfile", &jwt, Some(doc)).0, 200);

    // Provisioned.
    let req =
        json!({"deviceName": "prov-1", "provisionDeviceKey": "fleet-key", "provisionDeviceSecret": "fleet-secret"});
    let (st, out) = s.json("POST", "/api/v1/provision", "", Some(req));
    assert_eq!((st, out["status"].as_str()), (200, Some("SUCCESS")), "{out}");
    // Created by a gateway (of the profile's type, so of the profile).
    s.gateway(&jwt, "gw", "FLEETGW");
    let (mut gw, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("FLEETGW"), 60);
    gw.publish("v1/gateway/connect", br#"{"device":"gw-child","type":"fleet"}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(gw.recv(), Some(Packet::PubAck(_))));
    // Imported.
    let import = json!({"file": "imp-1,fleet,IMPTOKEN1\n", "mapping": {"columns": [{"type": "NAME"}, {"type": "TYPE"},
        {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": false, "header": false}});
    let (st, out) = s.json("POST", "/api/device/bulk_import", &jwt, Some(import));
    assert_eq!((st, out["created"].as_i64()), (200, Some(1)), "{out}");

    for name in ["prov-1", "gw-child", "imp-1"] {
        let (_, d) = s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), &jwt, None);
        let id = d["id"]["id"].as_str().unwrap();
        let path =
            format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SHARED_SCOPE?keys=fw_title,fw_version");
        let mut attrs = Vec::new();
        wait_until(&format!("{name}'s fw_* attributes"), || {
            attrs = s.json("GET", &path, &jwt, None).1.as_array().cloned().unwrap_or_default();
            attrs.len() == 2
        });
        assert!(attrs.iter().any(|a| a["key"] == "fw_title" && a["value"] == "fleet-fw"), "{name}: {attrs:?}");
    }
}

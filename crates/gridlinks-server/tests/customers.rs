//! Customers as a tenant administrator manages them, through ThingsBoard's REST paths on
//! the real binary: created, listed, found by title, devices and dashboards assigned and
//! taken back, and a deleted customer's devices and dashboards assigned to it no more.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";

#[test]
fn customers_get_devices_and_dashboards_assigned() {
    let s = Server::start();
    let jwt = s.login();
    let (st, acme) =
        s.json("POST", "/api/customer", &jwt, Some(json!({"title": "Acme", "email": "ops@acme.test", "city": "Kyiv"})));
    assert_eq!(st, 200, "{acme}");
    let acme_id = acme["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!((acme["id"]["entityType"].as_str(), acme["city"].as_str()), (Some("CUSTOMER"), Some("Kyiv")));
    let (_, globex) = s.json("POST", "/api/customer", &jwt, Some(json!({"title": "Globex"})));
    let globex_id = globex["id"]["id"].as_str().unwrap().to_owned();
    let (st, dup) = s.json("POST", "/api/customer", &jwt, Some(json!({"title": "Acme"})));
    assert_eq!(st, 400, "{dup}");
    assert_eq!(s.json("POST", "/api/customer", &jwt, Some(json!({"email": "x"}))).0, 400, "no title");

    let (_, page) = s.json("GET", "/api/customers?pageSize=10&page=0", &jwt, None);
    let titles: Vec<&str> = page["data"].as_array().unwrap().iter().map(|c| c["title"].as_str().unwrap()).collect();
    assert_eq!(titles, ["Acme", "Globex"]);
    let (_, found) = s.json("GET", "/api/tenant/customers?customerTitle=Globex", &jwt, None);
    assert_eq!(found["id"]["id"].as_str(), Some(&*globex_id));
    assert_eq!(s.json("GET", "/api/tenant/customers?customerTitle=Nobody", &jwt, None).0, 404);

    // Devices: assigned, listed per customer, taken back.
    let d1 = s.device(&jwt, "acme-1", "ACME1TOKEN");
    let d2 = s.device(&jwt, "acme-2", "ACME2TOKEN");
    s.device(&jwt, "loose-1", "LOOSE1TOKEN");
    for d in [&d1, &d2] {
        let (st, dev) = s.json("POST", &format!("/api/customer/{acme_id}/device/{d}"), &jwt, None);
        assert_eq!((st, dev["customerId"]["id"].as_str()), (200, Some(&*acme_id)), "{dev}");
    }
    let list = |cid: &str| -> Vec<String> {
        let (st, p) = s.json("GET", &format!("/api/customer/{cid}/devices?pageSize=10&page=0"), &jwt, None);
        assert_eq!(st, 200, "{p}");
        p["data"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(list(&acme_id), ["acme-1", "acme-2"]);
    assert!(list(&globex_id).is_empty());
    let (_, dev) = s.json("GET", &format!("/api/device/{d1}"), &jwt, None);
    assert_eq!(dev["customerId"]["id"].as_str(), Some(&*acme_id));
    let (st, dev) = s.json("DELETE", &format!("/api/customer/device/{d2}"), &jwt, None);
    assert_eq!((st, dev["customerId"]["id"].as_str()), (200, Some(NULL_UUID)));
    assert_eq!(list(&acme_id), ["acme-1"]);
    let ghost = "00000000-0000-0000-0000-00000000000c";
    assert_eq!(s.json("POST", &format!("/api/customer/{ghost}/device/{d1}"), &jwt, None).0, 404, "no such customer");
    // ThingsBoard 4.4's owner API does the same.
    let (_, me) = s.json("GET", "/api/auth/user", &jwt, None);
    let tenant = me["tenantId"]["id"].as_str().unwrap().to_owned();
    let (st, dev) = s.json("POST", &format!("/api/owner/CUSTOMER/{globex_id}/DEVICE/{d2}"), &jwt, None);
    assert_eq!((st, dev["customerId"]["id"].as_str()), (200, Some(&*globex_id)));
    let (st, dev) = s.json("POST", &format!("/api/owner/TENANT/{tenant}/DEVICE/{d2}"), &jwt, None);
    assert_eq!((st, dev["customerId"]["id"].as_str()), (200, Some(NULL_UUID)));
    assert_eq!(s.json("POST", &format!("/api/owner/TENANT/{ghost}/DEVICE/{d2}"), &jwt, None).0, 403, "another tenant");
    assert_eq!(s.json("POST", &format!("/api/owner/CUSTOMER/{globex_id}/EDGE/{d2}"), &jwt, None).0, 400);
    assert_eq!(
        s.json("POST", &format!("/api/owner/CUSTOMER/{globex_id}/ASSET/{d2}"), &jwt, None).0,
        404,
        "no such asset"
    );
    // Assignment survives updates of the device.
    let (_, dev) = s.json("GET", &format!("/api/device/{d1}"), &jwt, None);
    let mut renamed = dev.clone();
    renamed["label"] = json!("relabelled");
    let (_, saved) = s.json("POST", "/api/device", &jwt, Some(renamed));
    assert_eq!(saved["customerId"]["id"].as_str(), Some(&*acme_id));

    // Dashboards: assigned to customers, shown with their titles, kept across a re-save.
    let (_, dash) = s.json("POST", "/api/dashboard", &jwt, Some(json!({"title": "Plant", "configuration": {}})));
    let dash_id = dash["id"]["id"].as_str().unwrap().to_owned();
    let (st, info) = s.json("POST", &format!("/api/customer/{acme_id}/dashboard/{dash_id}"), &jwt, None);
    assert_eq!(st, 200, "{info}");
    assert_eq!(
        info["assignedCustomers"],
        json!([{"customerId": {"entityType": "CUSTOMER", "id": acme_id}, "title": "Acme", "public": false}])
    );
    s.json("POST", &format!("/api/customer/{globex_id}/dashboard/{dash_id}"), &jwt, None);
    let (_, full) = s.json("GET", &format!("/api/dashboard/{dash_id}"), &jwt, None);
    let (_, resaved) = s.json("POST", "/api/dashboard", &jwt, Some(full));
    assert_eq!(resaved["assignedCustomers"].as_array().unwrap().len(), 2, "a client's re-save keeps the assignment");
    let (_, of) = s.json("GET", &format!("/api/customer/{globex_id}/dashboards?pageSize=10&page=0"), &jwt, None);
    assert_eq!(of["data"][0]["title"], "Plant");
    let (_, back) = s.json("DELETE", &format!("/api/customer/{globex_id}/dashboard/{dash_id}"), &jwt, None);
    assert_eq!(back["assignedCustomers"].as_array().unwrap().len(), 1);

    // Deleting a customer: its devices and dashboards are assigned to it no more.
    assert_eq!(s.req("DELETE", &format!("/api/customer/{acme_id}"), Some(&jwt), None).0, 200);
    let (_, dev) = s.json("GET", &format!("/api/device/{d1}"), &jwt, None);
    assert_eq!(dev["customerId"]["id"].as_str(), Some(NULL_UUID));
    let (_, info) = s.json("GET", &format!("/api/dashboard/info/{dash_id}"), &jwt, None);
    assert_eq!(info["assignedCustomers"], J::Null);
    assert_eq!(s.json("GET", &format!("/api/customer/{acme_id}"), &jwt, None).0, 404);
    assert_eq!(s.json("GET", &format!("/api/customer/{acme_id}/devices?pageSize=10&page=0"), &jwt, None).0, 404);
}

//! ThingsBoard's WebSocket commands and entity data queries (also the body of the REST
//! entity query, `ws::parse_query`), their key filters, entity name patterns and the OTA
//! upload's multipart body: never panic, and what is accepted stays inside its bounds.
#![no_main]

use gridlinks_thingsboard::keyfilter::MAX_FILTERS;
use gridlinks_thingsboard::multipart;
use gridlinks_thingsboard::ws::{self, Cmd, EntityFilter, MAX_PAGE};
use gridlinks_types::Value;
use libfuzzer_sys::fuzz_target;

fn bounded(q: &ws::EntityQuery) {
    assert!((1..=MAX_PAGE).contains(&q.page_size));
    assert!(q.key_filters.len() <= MAX_FILTERS);
    if let EntityFilter::Relations(r) = &q.filter {
        assert!(r.direction == "FROM" || r.direction == "TO");
    }
    // Every predicate answers for any value, or none, without a panic.
    for f in &q.key_filters {
        for v in [None, Some(Value::Long(3)), Some(Value::Str("x".into())), Some(Value::Bool(true))] {
            let _ = f.predicate.matches(v.as_ref());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(m) = ws::parse(&text, 0) {
        for c in &m.cmds {
            match c {
                Cmd::EntityData(e) => e.query.iter().for_each(bounded),
                Cmd::EntityCount(_, Ok(q)) => bounded(q),
                _ => {}
            }
        }
    }
    if let Ok(j) = serde_json::from_slice(data) {
        if let Ok(q) = ws::parse_query(j) {
            bounded(&q);
        }
    }
    // A name and a pattern from the input: any split of it.
    let cut = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(i, _)| i);
    let _ = ws::name_matches(&text[..cut], &text[cut..]);
    if let Ok(boundary) = multipart::boundary(&text[..cut]) {
        let body = &text.as_bytes()[cut..];
        if let Ok(p) = multipart::part(body, boundary, "file") {
            assert!(p.data.len() <= body.len());
        }
    }
});

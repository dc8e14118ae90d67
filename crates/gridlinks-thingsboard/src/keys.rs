//! ThingsBoard's key lists: `keys=a,b`, `clientKeys=a, b`, `{"sharedKeys":"c,d"}`. One
//! parser for every place a list of telemetry or attribute keys arrives.

/// The keys of a comma-separated list, each trimmed; empty entries are dropped, so
/// `"a, b,,c "` is `[a, b, c]` and `""` is no key at all.
pub fn parse(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_and_drops_empty_entries() {
        assert_eq!(parse("a, b,c"), ["a", "b", "c"]);
        assert_eq!(parse(" a ,, b ,"), ["a", "b"]);
        assert_eq!(parse("with space"), ["with space"]);
        assert!(parse("").is_empty());
        assert!(parse(" , ").is_empty());
    }
}

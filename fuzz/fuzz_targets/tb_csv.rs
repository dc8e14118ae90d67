//! ThingsBoard's bulk-import CSV reader: never panics, numbers records by strictly
//! increasing lines of the file, and every record it accepts, written back with every cell
//! quoted, reads back as one record with the same cells.
#![no_main]

use gridlinks_thingsboard::csv::records;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&d, rest)) = data.split_first() else { return };
    let delimiter = [',', ';', '\t', '|'][usize::from(d % 4)];
    let Ok(file) = std::str::from_utf8(rest) else { return };
    let got = records(file, delimiter);
    let lines = file.split('\n').count();
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(got.iter().all(|(l, _)| (1..=lines).contains(l)));
    for cells in got.iter().filter_map(|(_, c)| c.as_ref().ok()) {
        let quoted: Vec<String> = cells.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect();
        let again = records(&quoted.join(&delimiter.to_string()), delimiter);
        assert_eq!(again.len(), 1, "{cells:?}");
        assert_eq!(again[0].1.as_ref(), Ok(cells), "{cells:?}");
    }
});

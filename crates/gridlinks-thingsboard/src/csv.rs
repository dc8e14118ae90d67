//! The CSV of ThingsBoard's bulk import, read strictly, record by record (RFC 4180). A
//! quoted cell may hold line breaks, as in ThingsBoard (Apache Commons CSV) and in what
//! spreadsheets export. A record that is not well-formed CSV — a quote never closed, text
//! after a closing quote, a quote inside an unquoted cell — is one error for its first
//! line, never a device whose name swallowed the delimiters and the lines after it: when
//! the lines a quoted cell would join are not one well-formed record, the first line is
//! read (and refused) alone and reading goes on with the next.

use gridlinks_types::Value;

use crate::payload::cast_string;

/// A line's cells, or what is wrong with it.
pub fn split_line(line: &str, delimiter: char) -> Result<Vec<String>, String> {
    let mut cells = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        // Spaces before an opening quote are allowed (hand-written files have them).
        let mut cell = String::new();
        while chars.peek() == Some(&' ') {
            cell.push(' ');
            chars.next();
        }
        if chars.peek() == Some(&'"') {
            chars.next();
            cell.clear();
            loop {
                match chars.next() {
                    None => return Err(format!("unclosed quote in cell {}", cells.len() + 1)),
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        cell.push('"');
                    }
                    Some('"') => break,
                    Some(c) => cell.push(c),
                }
            }
            while chars.peek() == Some(&' ') {
                chars.next();
            }
            match chars.next() {
                None => {
                    cells.push(cell);
                    return Ok(cells);
                }
                Some(c) if c == delimiter => cells.push(cell),
                Some(c) => return Err(format!("unexpected {c:?} after the closing quote of cell {}", cells.len() + 1)),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        cells.push(cell);
                        return Ok(cells);
                    }
                    Some(c) if c == delimiter => break,
                    Some('"') => {
                        return Err(format!(
                            "quote inside unquoted cell {} (quote the whole cell and double the quote)",
                            cells.len() + 1
                        ))
                    }
                    Some(c) => cell.push(c),
                }
            }
            cells.push(cell);
        }
    }
}

/// The file's records, each with the 1-based number of the line it starts on, as cells
/// or what is wrong with it. Line ends are `\n` or `\r\n`; empty lines are left out. A
/// record goes on past a line end only inside a quoted cell.
pub fn records(file: &str, delimiter: char) -> Vec<(usize, Result<Vec<String>, String>)> {
    let mut lines = Vec::new();
    let mut start = 0;
    for line in file.split('\n') {
        lines.push((start, start + line.len()));
        start += line.len() + 1;
    }
    let text = |first: usize, last: usize| {
        let t = &file[lines[first].0..lines[last].1];
        t.strip_suffix('\r').unwrap_or(t)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut last = i;
        let mut state = Scan::CellStart;
        loop {
            state = state.over(&file[lines[last].0..lines[last].1], delimiter);
            if state != Scan::Quoted || last + 1 == lines.len() {
                break;
            }
            last += 1;
        }
        let joined =
            (last > i && state != Scan::Quoted).then(|| split_line(text(i, last), delimiter)).and_then(Result::ok);
        let (cells, next) = match joined {
            Some(cells) => (Ok(cells), last + 1),
            None => (split_line(text(i, i), delimiter), i + 1),
        };
        if !text(i, i).trim().is_empty() {
            out.push((i + 1, cells));
        }
        i = next;
    }
    out
}

/// Where a scan of a record stands at a line end: only [`Scan::Quoted`] goes on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Before a cell's first character (or its leading spaces).
    CellStart,
    /// Inside a quoted cell.
    Quoted,
    /// A quote inside a quoted cell: its end, or the first of a doubled quote.
    QuoteInQuoted,
    /// In an unquoted cell or after a closing quote, up to the delimiter.
    Rest,
}

impl Scan {
    fn over(mut self, line: &str, delimiter: char) -> Scan {
        for c in line.chars() {
            self = match (self, c) {
                (Scan::CellStart, ' ') => Scan::CellStart,
                (Scan::CellStart, '"') | (Scan::QuoteInQuoted, '"') => Scan::Quoted,
                (Scan::Quoted, '"') => Scan::QuoteInQuoted,
                (Scan::Quoted, _) => Scan::Quoted,
                (_, c) if c == delimiter => Scan::CellStart,
                _ => Scan::Rest,
            };
        }
        // A line break inside a quoted cell is part of it; a quote just before the line
        // end closed the cell.
        if self == Scan::QuoteInQuoted {
            Scan::Rest
        } else {
            self
        }
    }
}

/// A cell's value, typed as ThingsBoard's `TypeCastUtil` does: `true` / `false` in any
/// case are booleans, numeric text is a number, anything else stays text.
pub fn cell_value(cell: &str) -> Value {
    match cell.to_ascii_lowercase().as_str() {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => cast_string(cell),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_lines() {
        assert_eq!(split_line("a,b,,c", ',').unwrap(), ["a", "b", "", "c"]);
        assert_eq!(
            split_line(r#""Floor 1, east","say ""hi""",x"#, ',').unwrap(),
            ["Floor 1, east", r#"say "hi""#, "x"]
        );
        assert_eq!(split_line(r#"a, "b" ,c"#, ',').unwrap(), ["a", "b", "c"]);
        assert_eq!(split_line("a;b", ';').unwrap(), ["a", "b"]);
        assert_eq!(split_line("", ',').unwrap(), [""]);
        assert_eq!(split_line(r#""""#, ',').unwrap(), [""]);
    }

    #[test]
    fn broken_quoting_is_an_error_for_the_line() {
        assert!(split_line(r#""bq1,t,tokbq1"#, ',').unwrap_err().contains("unclosed quote"));
        assert!(split_line(r#""bq1"x,t"#, ',').unwrap_err().contains("after the closing quote"));
        assert!(split_line(r#"bq"1,t"#, ',').unwrap_err().contains("quote inside"));
    }

    #[test]
    fn cells_are_typed_as_thingsboard_casts_them() {
        assert_eq!(cell_value("TRUE"), Value::Bool(true));
        assert_eq!(cell_value("false"), Value::Bool(false));
        assert_eq!(cell_value("42"), Value::Long(42));
        assert_eq!(cell_value("4.5"), Value::Double(4.5));
        assert_eq!(cell_value("Floor 1"), Value::Str("Floor 1".into()));
    }

    #[test]
    fn records_are_numbered_by_the_line_they_start_on() {
        let got = records("h\r\na\n\nb\n", ',');
        assert_eq!(got, [(1, Ok(vec!["h".into()])), (2, Ok(vec!["a".into()])), (4, Ok(vec!["b".into()]))]);
    }

    #[test]
    fn a_quoted_cell_may_hold_line_breaks() {
        let file = "name,description\r\nd1,\"first\r\n\r\nsecond, \"\"quoted\"\"\"\r\nd2,\"\"\"\"\nd3, \"x\"\n";
        let got: Vec<_> = records(file, ',').into_iter().map(|(l, c)| (l, c.unwrap())).collect();
        assert_eq!(
            got,
            [
                (1, vec!["name", "description"]),
                (2, vec!["d1", "first\r\n\r\nsecond, \"quoted\""]),
                (5, vec!["d2", "\""]),
                (6, vec!["d3", "x"]),
            ]
            .map(|(l, c)| (l, c.into_iter().map(String::from).collect::<Vec<_>>()))
        );
    }

    #[test]
    fn a_broken_quote_is_an_error_for_its_line_alone() {
        // Line 2's quote is left open; line 3's quote would close it but is followed by
        // text, so lines 2 and 3 are no record: each is read, and refused, alone. Line 1's
        // quote, inside an unquoted cell, opens nothing.
        let file = "a\"b,1\n\"c,2\n\"d\"x,3\ne,4\n\"f,5";
        let got = records(file, ',');
        let lines: Vec<usize> = got.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5]);
        for (i, what) in
            [(0, "quote inside"), (1, "unclosed quote"), (2, "after the closing quote"), (4, "unclosed quote")]
        {
            assert!(got[i].1.as_ref().unwrap_err().contains(what), "{got:?}");
        }
        assert_eq!(got[3].1, Ok(vec!["e".into(), "4".into()]));
    }
}

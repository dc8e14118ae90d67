//! The CSV of ThingsBoard's bulk import, read strictly and line by line (RFC 4180 quoting
//! within a line). A line that is not well-formed CSV — an unclosed quote, text after a
//! closing quote, a quote inside an unquoted cell — is one error for that line, never a
//! device whose name swallowed the delimiters and the lines after it. A cell never spans
//! lines: nothing a device import maps may hold a line break.

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

/// The file's lines with their 1-based numbers, without line ends (`\n` or `\r\n`);
/// empty lines are left out.
pub fn lines(file: &str) -> impl Iterator<Item = (usize, &str)> {
    file.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
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
    fn lines_are_numbered_as_in_the_file() {
        let got: Vec<_> = lines("h\r\na\n\nb\n").collect();
        assert_eq!(got, [(1, "h"), (2, "a"), (4, "b")]);
    }
}

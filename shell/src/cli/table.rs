//! Plain text tables: a header and rows, columns padded to their widest cell (numbers to
//! the right), two spaces apart.

pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: Vec<&'static str>) -> Self {
        Self {
            header,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The lines of the table, header first, without trailing spaces.
    pub fn lines(&self) -> Vec<String> {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        let mut numeric = vec![true; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
                if cell.parse::<f64>().is_err() && cell != "-" {
                    numeric[i] = false;
                }
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        std::iter::once(&header)
            .chain(&self.rows)
            .map(|row| {
                let cells: Vec<String> = (0..columns)
                    .map(|i| {
                        let cell = row.get(i).map(String::as_str).unwrap_or("");
                        let pad = widths[i].saturating_sub(cell.chars().count());
                        if numeric[i] && !self.rows.is_empty() {
                            format!("{}{cell}", " ".repeat(pad))
                        } else {
                            format!("{cell}{}", " ".repeat(pad))
                        }
                    })
                    .collect();
                cells.join("  ").trim_end().to_owned()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_numbers_to_the_right() {
        let mut t = Table::new(vec!["GROUP", "PARTITION", "LAG"]);
        t.row(vec!["billing".into(), "0".into(), "12".into()]);
        t.row(vec!["a".into(), "10".into(), "-".into()]);
        assert_eq!(
            t.lines(),
            vec![
                "GROUP    PARTITION  LAG",
                "billing          0   12",
                "a               10    -",
            ]
        );
    }
}

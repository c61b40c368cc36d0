//! An error and its sources as the text the control API answers and the one line the CLI prints.

/// `e` and its sources: each source not already in the text so far is appended after `": "`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// [`chain`] as one line: line breaks (CRIU's log lines) become `"; "`.
pub fn one_line(e: &dyn std::error::Error) -> String {
    chain(e).trim().replace('\n', "; ")
}

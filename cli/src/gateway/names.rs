//! Container and namespace names from a request are checked as names before they reach a socket
//! path: containerd's identifier rules (`identifiers.Validate`): letters and digits, single `.`,
//! `_` or `-` between them, at most 76 characters. So no `/`, no `..`, nothing absolute: a
//! header cannot point the gateway at a socket outside the shims' control directory.

/// containerd's longest identifier.
pub const MAX_LEN: usize = 76;

/// A name that containerd would refuse.
#[derive(Debug, thiserror::Error)]
#[error("{what} name {shown:?} is not valid: {why}")]
pub struct InvalidName {
    /// "container" or "namespace".
    what: &'static str,
    /// The name, cut short.
    shown: String,
    why: String,
}

/// Checks `name` (a `what`: "container" or "namespace") against containerd's identifier rules.
pub fn check(what: &'static str, name: &str) -> Result<(), InvalidName> {
    let shown: String = name.chars().take(MAX_LEN + 4).collect();
    let bad = |why: &str| {
        Err(InvalidName {
            what,
            shown: shown.clone(),
            why: why.to_string(),
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_LEN {
        return bad(&format!("it is longer than {MAX_LEN} characters"));
    }
    let mut prev_sep = true;
    for c in name.chars() {
        let sep = matches!(c, '.' | '_' | '-');
        if !(c.is_ascii_alphanumeric() || sep) {
            return bad("only letters, digits, '.', '_' and '-' are allowed");
        }
        if sep && prev_sep {
            return bad("'.', '_' and '-' must stand between letters or digits");
        }
        prev_sep = sep;
    }
    if prev_sep {
        return bad("it must end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_identifiers_pass_and_paths_do_not() {
        for ok in [
            "default",
            "k8s.io",
            "moby",
            "gw-header",
            "a",
            "A1_b-c.d",
            &"x".repeat(76),
        ] {
            assert!(check("container", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/tmp",
            "..",
            "../x",
            "a/b",
            "a..b",
            ".hidden",
            "-x",
            "x-",
            "a b",
            "a\0b",
            "ns\u{e9}",
            &"x".repeat(77),
        ] {
            let e = check("namespace", bad).unwrap_err().to_string();
            assert!(e.starts_with("namespace name"), "{e}");
        }
    }
}

//! `--params`: inline JSON, `@FILE`, or `@-` (stdin).

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::error::CliError;

/// Reads `--params`: `@-` reads stdin, `@PATH` reads the file at PATH, anything else is the
/// JSON itself. The params must be a JSON object.
pub fn load(arg: &str) -> Result<Value, CliError> {
    let (text, origin) = match arg.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| CliError::Usage(format!("--params @-: reading stdin failed: {e}")))?;
            (text, "stdin".to_owned())
        }
        Some(path) => (read_file(Path::new(path))?, path.to_owned()),
        None => (arg.to_owned(), "--params".to_owned()),
    };
    parse(&text, &origin)
}

fn read_file(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("--params @{}: {e}", path.display())))
}

/// Parses params text read from `origin` (named in the error).
pub fn parse(text: &str, origin: &str) -> Result<Value, CliError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| CliError::Usage(format!("{origin}: not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(CliError::Usage(format!("{origin}: params must be a JSON object")));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inline_json_is_the_params() {
        assert_eq!(load(r#"{"items": 3}"#).unwrap(), json!({"items": 3}));
    }

    #[test]
    fn at_file_reads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("params.json");
        std::fs::write(&path, "{\"items\": 5,\n \"item_ms\": 1}\n").unwrap();
        let arg = format!("@{}", path.display());
        assert_eq!(load(&arg).unwrap(), json!({"items": 5, "item_ms": 1}));
    }

    #[test]
    fn bad_params_are_usage_errors_naming_their_origin() {
        let missing = load("@/no/such/params.json").unwrap_err();
        assert!(matches!(&missing, CliError::Usage(m) if m.contains("/no/such/params.json")));
        let broken = load("{items: 3}").unwrap_err();
        assert!(matches!(&broken, CliError::Usage(m) if m.contains("not valid JSON")));
        let array = load("[1, 2]").unwrap_err();
        assert!(matches!(&array, CliError::Usage(m) if m.contains("JSON object")), "{array}");
        assert_eq!(missing.exit(), crate::error::Exit::Usage);
    }
}

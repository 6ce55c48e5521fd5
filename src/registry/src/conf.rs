//! dat.conf: one provider entry a line, eight whitespace-separated fields,
//! `#` starts a comment, double quotes keep spaces inside a field:
//!
//! ```text
//! <ia_name> <api> <threadsafe|nonthreadsafe> <default|nondefault> <library> <provider_version> "<ia_params>" "<platform_params>"
//! rs-tcp u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 "tcp lo" ""
//! ```
//!
//! `api` is `u` (user) or `k` (kernel) followed by `major.minor`;
//! `provider_version` is `id.major.minor`.

use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable naming the dat.conf to read instead of the default.
pub const OVERRIDE_ENV: &str = "DAT_OVERRIDE";
/// The dat.conf read when [`OVERRIDE_ENV`] is not set.
pub const DEFAULT_CONF: &str = "/etc/dat.conf";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfEntry {
    pub ia_name: String,
    /// `true` for a `u` (user-level) API, `false` for `k`.
    pub user_api: bool,
    pub api_major: u32,
    pub api_minor: u32,
    pub thread_safe: bool,
    pub is_default: bool,
    pub library: String,
    pub provider_id: String,
    pub provider_major: u32,
    pub provider_minor: u32,
    pub ia_params: String,
    pub platform_params: String,
    /// Where the entry came from, for messages: `file:line`.
    pub origin: String,
}

impl ConfEntry {
    /// Fields 2 to 4 as dat.conf spells them: `u2.0 nonthreadsafe default`.
    pub fn api_fields(&self) -> String {
        format!(
            "{}{}.{} {} {}",
            if self.user_api { 'u' } else { 'k' },
            self.api_major,
            self.api_minor,
            if self.thread_safe {
                "threadsafe"
            } else {
                "nonthreadsafe"
            },
            if self.is_default {
                "default"
            } else {
                "nondefault"
            },
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError {
    pub origin: String,
    pub reason: String,
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin, self.reason)
    }
}

/// The dat.conf path in effect: `$DAT_OVERRIDE`, else `/etc/dat.conf`.
pub fn conf_path() -> PathBuf {
    match std::env::var_os(OVERRIDE_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_CONF),
    }
}

/// Reads and parses a dat.conf. A missing file is an empty registry; bad
/// lines are reported and skipped, so one typo does not hide every entry.
/// The file is bytes: a line that is not UTF-8 text is one bad line (a
/// comment in Latin-1 is just a comment), never the whole file.
pub fn load(path: &Path) -> (Vec<ConfEntry>, Vec<ConfError>) {
    match std::fs::read(path) {
        Ok(bytes) => parse_bytes(&bytes, &path.display().to_string()),
        Err(e) => (
            Vec::new(),
            vec![ConfError {
                origin: path.display().to_string(),
                reason: format!("cannot read: {e}"),
            }],
        ),
    }
}

/// Parses dat.conf text; `source` names it in messages.
pub fn parse(text: &str, source: &str) -> (Vec<ConfEntry>, Vec<ConfError>) {
    parse_bytes(text.as_bytes(), source)
}

/// Parses a dat.conf's bytes, a line at a time (`\n`, or `\r\n`). A line's
/// comment is cut off as bytes first (`#` outside double quotes: a byte no
/// multi-byte character of UTF-8 or of a legacy 8-bit encoding contains),
/// so bytes that are not UTF-8 in a comment change nothing; a line whose
/// fields are not UTF-8 is reported and skipped like any other bad line.
pub fn parse_bytes(bytes: &[u8], source: &str) -> (Vec<ConfEntry>, Vec<ConfError>) {
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    for (idx, raw) in body.split(|&b| b == b'\n').enumerate() {
        if bytes.is_empty() {
            break;
        }
        let origin = format!("{source}:{}", idx + 1);
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let parsed = match std::str::from_utf8(uncommented(line)) {
            Ok(text) => parse_line(text, &origin),
            Err(e) => Err(format!(
                "not UTF-8 text (byte {:#04x} at column {})",
                line[e.valid_up_to()],
                e.valid_up_to() + 1
            )),
        };
        match parsed {
            Ok(Some(e)) => entries.push(e),
            Ok(None) => {}
            Err(reason) => errors.push(ConfError { origin, reason }),
        }
    }
    (entries, errors)
}

/// A line up to its comment: the first `#` outside double quotes.
fn uncommented(line: &[u8]) -> &[u8] {
    let mut quoted = false;
    for (i, &b) in line.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Splits a line into fields: whitespace separates, `"..."` groups (the
/// quotes are dropped, `""` is an empty field), `#` outside quotes ends it.
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            Some('"') => {
                chars.next();
                let mut field = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => field.push(c),
                        None => return Err("unterminated quote".into()),
                    }
                }
                fields.push(field);
            }
            Some(_) => {
                let mut field = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '#' {
                        break;
                    }
                    field.push(c);
                    chars.next();
                }
                fields.push(field);
            }
        }
    }
    Ok(fields)
}

fn parse_version_pair(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn parse_line(line: &str, origin: &str) -> Result<Option<ConfEntry>, String> {
    let f = split_fields(line)?;
    if f.is_empty() {
        return Ok(None);
    }
    if f.len() != 8 {
        return Err(format!("expected 8 fields, found {}", f.len()));
    }
    let api = &f[1];
    let user_api = match api.chars().next() {
        Some('u') => true,
        Some('k') => false,
        _ => return Err(format!("API version '{api}' must start with 'u' or 'k'")),
    };
    let (api_major, api_minor) =
        parse_version_pair(&api[1..]).ok_or_else(|| format!("bad API version '{api}'"))?;
    let thread_safe = match f[2].as_str() {
        "threadsafe" => true,
        "nonthreadsafe" => false,
        other => {
            return Err(format!(
                "thread safety '{other}' is neither threadsafe nor nonthreadsafe"
            ))
        }
    };
    let is_default = match f[3].as_str() {
        "default" => true,
        "nondefault" => false,
        other => return Err(format!("'{other}' is neither default nor nondefault")),
    };
    let pv = &f[5];
    let (provider_id, rest) = pv
        .split_once('.')
        .ok_or_else(|| format!("bad provider version '{pv}' (want id.major.minor)"))?;
    let (provider_major, provider_minor) = parse_version_pair(rest)
        .ok_or_else(|| format!("bad provider version '{pv}' (want id.major.minor)"))?;
    if f[0].len() >= dat_abi::DAT_NAME_MAX_LENGTH {
        return Err(format!(
            "IA name longer than {} bytes",
            dat_abi::DAT_NAME_MAX_LENGTH - 1
        ));
    }
    Ok(Some(ConfEntry {
        ia_name: f[0].clone(),
        user_api,
        api_major,
        api_minor,
        thread_safe,
        is_default,
        library: f[4].clone(),
        provider_id: provider_id.to_string(),
        provider_major,
        provider_minor,
        ia_params: f[6].clone(),
        platform_params: f[7].clone(),
        origin: origin.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ofed_entry() {
        let (e, err) = parse(
            "# comment\n\nofa-v2-ib0 u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"ib0 0\" \"\"\n",
            "t",
        );
        assert!(err.is_empty(), "{err:?}");
        assert_eq!(e.len(), 1);
        let e = &e[0];
        assert_eq!(e.ia_name, "ofa-v2-ib0");
        assert!(e.user_api && !e.thread_safe && e.is_default);
        assert_eq!((e.api_major, e.api_minor), (2, 0));
        assert_eq!(e.library, "libdaplofa.so.2");
        assert_eq!(
            (e.provider_id.as_str(), e.provider_major, e.provider_minor),
            ("dapl", 2, 0)
        );
        assert_eq!(e.ia_params, "ib0 0");
        assert_eq!(e.platform_params, "");
        assert_eq!(e.origin, "t:3");
    }

    #[test]
    fn trailing_comment_and_tabs() {
        let (e, err) = parse(
            "a\tu1.2 threadsafe nondefault /x/lib.so p.1.2 \"\" \"y z\" # tail\n",
            "t",
        );
        assert!(err.is_empty());
        assert_eq!(e[0].platform_params, "y z");
        assert!(e[0].thread_safe && !e[0].is_default);
        assert_eq!((e[0].api_major, e[0].api_minor), (1, 2));
    }

    #[test]
    fn bad_lines_are_reported_and_skipped() {
        let text = "x u2.0 nonthreadsafe default lib dapl.2.0 \"a\"\n\
                    y v2.0 nonthreadsafe default lib dapl.2.0 \"\" \"\"\n\
                    z u2.0 maybe default lib dapl.2.0 \"\" \"\"\n\
                    w u2.0 nonthreadsafe default lib dapl.2.0 \"open \"\"\n\
                    ok u2.0 nonthreadsafe default lib dapl.2.0 \"\" \"\"\n";
        let (e, err) = parse(text, "t");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].ia_name, "ok");
        assert_eq!(err.len(), 4);
        assert!(err[0].reason.contains("8 fields"));
    }

    /// Bytes that are not UTF-8 cost their own line at most: in a comment
    /// nothing, in a field that line (said with file and line); every other
    /// entry of the file stays.
    #[test]
    fn bytes_that_are_not_utf8_cost_their_line_at_most() {
        let mut file = Vec::new();
        file.extend_from_slice(b"# r\xe9seau (a Latin-1 comment)\n");
        file.extend_from_slice(b"rs-tcp u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 \"tcp lo\" \"\" # caf\xe9\n");
        file.extend_from_slice(b"bad\xff u2.0 nonthreadsafe default libx.so dapl.2.0 \"\" \"\"\n");
        file.extend_from_slice(b"\xff\xfe\n");
        file.extend_from_slice(
            b"ofa-v2-ib0 u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"ib0 0\" \"\"\r\n",
        );
        file.extend_from_slice(b"quoted u2.0 nonthreadsafe default libq.so dapl.2.0 \"a#b\" \"\"");
        let (entries, errors) = parse_bytes(&file, "dat.conf");
        let names: Vec<&str> = entries.iter().map(|e| e.ia_name.as_str()).collect();
        assert_eq!(names, ["rs-tcp", "ofa-v2-ib0", "quoted"]);
        assert_eq!(entries[2].ia_params, "a#b", "a quoted # is no comment");
        assert_eq!(entries[1].ia_params, "ib0 0");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].origin, "dat.conf:3");
        assert!(
            errors[0].reason.contains("not UTF-8"),
            "{}",
            errors[0].reason
        );
        assert_eq!(errors[1].origin, "dat.conf:4");
        assert_eq!(parse_bytes(b"", "x"), (Vec::new(), Vec::new()));
    }

    #[test]
    fn missing_file_is_empty_with_reason() {
        let (e, err) = load(Path::new("/nonexistent/dat.conf"));
        assert!(e.is_empty());
        assert_eq!(err.len(), 1);
    }
}

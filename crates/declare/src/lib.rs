//! One declaration per setting, for every configuration file of the project (the adapter's,
//! the node's, the cloud's). [`table!`](crate::table) declares a table of a configuration
//! file: each key once, with its doc comment, its type and its default (or none: the key is
//! required). From that one place come the struct serde reads (unknown keys refused, a missing
//! key given its default), the `Default` of a table that may be left out, the dotted names the
//! checks put in their errors (an associated constant per key: `RawDhcp::lease_time` is
//! `"dhcp.lease_time"`), and the configuration reference ([`Reference`]) that docs/ holds and
//! a test keeps current.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use ipnet::Ipv4Net;
use toml::Spanned;

// ---- locating a mistake in a file's text -------------------------------------------------

/// 1-based line of byte `offset` of `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.matches('\n').count() + 1)
}

/// The dotted key at byte `offset`: the table header above it and the key on its line,
/// e.g. `reservation[1].mac`.
pub fn key_at(text: &str, offset: usize) -> Option<String> {
    let line_no = line_of(text, offset);
    let lines: Vec<&str> = text.lines().collect();
    let line = lines.get(line_no - 1)?;
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_owned());
    let mut table = None;
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for l in &lines[..line_no.min(lines.len())] {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let n = counts.entry(name.trim().to_owned()).or_insert(0);
            table = Some(format!("{}[{}]", name.trim(), *n));
            *n += 1;
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            table = Some(name.trim().to_owned());
        }
    }
    match (table, key) {
        (Some(t), Some(k)) => Some(format!("{t}.{k}")),
        (None, Some(k)) => Some(k),
        (Some(t), None) => Some(t),
        (None, None) => None,
    }
}

/// The value written on the line of byte `offset` (what follows its `=`, without a comment
/// after it), when the line has one.
pub fn value_at(text: &str, offset: usize) -> Option<String> {
    let line = text.lines().nth(line_of(text, offset) - 1)?;
    let (_, value) = line.split_once('=')?;
    let value = value.split(" #").next().unwrap_or(value).trim();
    (!value.is_empty()).then(|| value.to_owned())
}

/// A parser's `message` about a value, with the `value` as written when it does not say it
/// already.
pub fn with_value(message: &str, value: Option<String>) -> String {
    match value {
        Some(v) if !message.contains(v.trim_matches('"')) => format!("{message}, found {v}"),
        _ => message.to_owned(),
    }
}

/// What the macro names in the calling crate's code.
#[doc(hidden)]
pub mod __private {
    pub use serde;
}

/// A value the file did not write: a default (its span is empty).
pub fn unwritten<T>(value: T) -> Spanned<T> {
    Spanned::new(0..0, value)
}

/// `key` (a key of an array of tables, `peer.endpoint`, `policy.group.name`) as it is named
/// in item `i` of its array: `peer[2].endpoint`, `policy.group[2].name`.
pub fn indexed(key: &str, i: usize) -> String {
    match key.rsplit_once('.') {
        Some((table, rest)) => format!("{table}[{i}].{rest}"),
        None => format!("{key}[{i}]"),
    }
}

/// What the reference says of a key's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// The key must be written.
    Required,
    /// Left out, it is unset (its doc says what that means).
    Unset,
    /// Left out, it has this value (as TOML writes it).
    Value(String),
}

/// One key of the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDoc {
    /// Its name in its table.
    pub name: &'static str,
    /// What it takes.
    pub kind: String,
    /// Its default.
    pub default: Given,
    /// Its doc comment.
    pub doc: String,
}

/// One table of the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDoc {
    /// Its dotted name (`dhcp`, `policy.group`, `vlan.legacy`): where it sits in the file,
    /// which is where its declaration says, or inside another table that holds it; empty for
    /// the file's top level.
    pub name: String,
    /// An array of tables (`[[peer]]`).
    pub array: bool,
    /// Whether it may be left out.
    pub optional: bool,
    /// Its doc comment.
    pub doc: String,
    /// Its keys, in declaration order.
    pub keys: Vec<KeyDoc>,
}

impl TableDoc {
    /// `key`'s dotted name in the file (`dhcp.lease_time`; at the top level, the key alone).
    fn dotted(&self, key: &KeyDoc) -> String {
        match self.name.as_str() {
            "" => key.name.to_owned(),
            table => format!("{table}.{}", key.name),
        }
    }
}

/// Every table and key of a configuration file, as declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reference {
    /// The tables, each before the tables inside it.
    pub tables: Vec<TableDoc>,
}

impl Reference {
    /// The reference of the file whose top-level table is `T`.
    pub fn of<T: Value>() -> Self {
        let mut out = Self::default();
        T::tables(&mut out, "", false, false);
        out
    }

    /// Every key's dotted name (`dhcp.lease_time`, `peer.endpoint`), in order.
    pub fn names(&self) -> Vec<String> {
        self.tables
            .iter()
            .flat_map(|t| t.keys.iter().map(move |k| t.dotted(k)))
            .collect()
    }

    /// The keys (dotted) that `example`, a file of this reference, sets nowhere: for the
    /// tests that keep an example file complete. A key of an array of tables counts as set
    /// when one item sets it.
    pub fn unset_in(&self, example: &str) -> Vec<String> {
        let Ok(example) = toml::from_str::<toml::Table>(example) else {
            return vec!["(the example does not parse)".into()];
        };
        let mut unset = Vec::new();
        for t in &self.tables {
            let mut found = vec![&example];
            for part in t.name.split('.').filter(|p| !p.is_empty()) {
                found = found
                    .into_iter()
                    .filter_map(|table| table.get(part))
                    .flat_map(|v| match v {
                        toml::Value::Table(t) => vec![t],
                        toml::Value::Array(items) => {
                            items.iter().filter_map(toml::Value::as_table).collect()
                        }
                        _ => Vec::new(),
                    })
                    .collect();
            }
            for k in &t.keys {
                if !found.iter().any(|table| table.contains_key(k.name)) {
                    unset.push(t.dotted(k));
                }
            }
        }
        unset
    }

    /// The keys (dotted) that `example` shows nowhere, set or commented out: for example
    /// files that leave some tables as comments (`# [enroll]`, `# key = ...`). A key counts as
    /// shown when a line `key = ...` or `# key = ...` lies under its table's header, itself
    /// written or commented out.
    pub fn unshown_in(&self, example: &str) -> Vec<String> {
        let mut shown: Vec<(String, String)> = Vec::new();
        let mut table = String::new();
        for line in example.lines() {
            let line = line.trim();
            let line = line.strip_prefix('#').map_or(line, str::trim_start);
            if let Some(name) = line
                .strip_prefix("[[")
                .and_then(|l| l.strip_suffix("]]"))
                .or_else(|| line.strip_prefix('[').and_then(|l| l.strip_suffix(']')))
            {
                name.trim().clone_into(&mut table);
            } else if let Some((key, _)) = line.split_once(" = ")
                && !key.is_empty()
                && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                shown.push((table.clone(), key.to_owned()));
            }
        }
        let mut unshown = Vec::new();
        for t in &self.tables {
            for k in &t.keys {
                if !shown
                    .iter()
                    .any(|(table, key)| *table == t.name && key == k.name)
                {
                    unshown.push(t.dotted(k));
                }
            }
        }
        unshown
    }

    /// The reference as Markdown: `title` and `intro`, then a section per table.
    pub fn markdown(&self, title: &str, intro: &str) -> String {
        let mut md = format!(
            "<!-- Generated from the declarations (cyphonic-settings' `table!`): edit those, \
             then run the tests. -->\n\n# {title}\n\n{intro}\n"
        );
        for t in self.tables.iter().filter(|t| !t.keys.is_empty()) {
            let header = match (t.name.as_str(), t.array) {
                ("", _) => "The top level".to_owned(),
                (name, true) => format!("`[[{name}]]`"),
                (name, false) => format!("`[{name}]`"),
            };
            let _ = write!(md, "\n## {header}\n\n");
            if !t.doc.is_empty() {
                let _ = write!(md, "{}\n\n", t.doc);
            }
            if t.optional {
                md.push_str("The table may be left out: every key then has its default.\n\n");
            }
            for k in &t.keys {
                let default = match &k.default {
                    Given::Required => "required".to_owned(),
                    Given::Unset => "unset by default".to_owned(),
                    Given::Value(v) => format!("default `{v}`"),
                };
                let _ = writeln!(md, "- **`{}`** ({}; {default}).", k.name, k.kind);
                if !k.doc.is_empty() {
                    let _ = writeln!(md, "  {}", k.doc.replace('\n', "\n  "));
                }
            }
        }
        md
    }
}

/// Keeps a generated file current: when `path` does not hold `contents`, writes them and says
/// so as an error, for a test to fail on (run it again, and commit the file:
/// rust-analyzer's `ensure_file_contents`).
///
/// # Errors
/// The file was not current (written, or the write's failure).
pub fn ensure_file(path: &std::path::Path, contents: &str) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    let written = std::fs::write(path, contents);
    Err(format!(
        "{} was not current; it has been written ({written:?}): run the tests again and \
         commit it",
        path.display()
    ))
}

/// Joins the lines of a doc comment into the reference's paragraphs: one space less at the
/// start of each line, an empty line between paragraphs.
pub fn doc_text(lines: &[&str]) -> String {
    let mut out = String::new();
    for line in lines {
        let line = line.strip_prefix(' ').unwrap_or(line).trim_end();
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(line);
    }
    out.trim().to_owned()
}

/// A type a key may have: what the reference calls it and how it shows a default. A table
/// declared by [`table!`](crate::table) is one too, and lists its keys.
pub trait Value {
    /// What the reference says the key takes.
    fn kind() -> String;
    /// The value as TOML writes it; empty for "unset".
    fn show(&self) -> String;
    /// For a table: adds itself, at the dotted name `at` (empty: where its declaration
    /// says), and the tables inside it to `out` and says true (`array`: it is an item of an
    /// array of tables; `optional`: it may be left out). Plain values say false.
    fn tables(out: &mut Reference, at: &str, array: bool, optional: bool) -> bool {
        let _ = (out, at, array, optional);
        false
    }
}

macro_rules! plain {
    ($kind:literal, $show:expr, $($ty:ty),*) => {
        $(
            impl Value for $ty {
                fn kind() -> String {
                    $kind.to_owned()
                }
                fn show(&self) -> String {
                    let show: fn(&Self) -> String = $show;
                    show(self)
                }
            }
        )*
    };
}

plain!("boolean", ToString::to_string, bool);
plain!("integer", ToString::to_string, u8, u16, u32, u64, usize);
plain!("number", ToString::to_string, f64);
plain!("string", |s| format!("{s:?}"), String);
plain!(
    "path",
    |p| format!("{:?}", p.display().to_string()),
    PathBuf
);
plain!("address and port", |a| format!("\"{a}\""), SocketAddr);
plain!("IP address", |a| format!("\"{a}\""), IpAddr);
plain!("IPv4 address", |a| format!("\"{a}\""), Ipv4Addr);
plain!("IPv6 address", |a| format!("\"{a}\""), Ipv6Addr);
plain!("IPv4 block", |a| format!("\"{a}\""), Ipv4Net);
plain!("IPv6 block", |a| format!("\"{a}\""), ipnet::Ipv6Net);

impl<T: Value> Value for Spanned<T> {
    fn kind() -> String {
        T::kind()
    }
    fn show(&self) -> String {
        self.get_ref().show()
    }
    fn tables(out: &mut Reference, at: &str, array: bool, optional: bool) -> bool {
        T::tables(out, at, array, optional)
    }
}

impl<T: Value> Value for Option<T> {
    fn kind() -> String {
        T::kind()
    }
    fn show(&self) -> String {
        self.as_ref().map(Value::show).unwrap_or_default()
    }
    fn tables(out: &mut Reference, at: &str, array: bool, _optional: bool) -> bool {
        T::tables(out, at, array, true)
    }
}

impl<T: Value> Value for Vec<T> {
    fn kind() -> String {
        format!("list of {}", plural(&T::kind()))
    }
    fn show(&self) -> String {
        let items: Vec<String> = self.iter().map(Value::show).collect();
        format!("[{}]", items.join(", "))
    }
    fn tables(out: &mut Reference, at: &str, _array: bool, _optional: bool) -> bool {
        T::tables(out, at, true, true)
    }
}

/// A key that takes one string or a list of them (`address = "a"`, `address = ["a", "b"]`).
/// (Errors point at the whole value: toml's spans do not survive serde's untagged enums.)
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum OneOrMore {
    /// One string.
    One(String),
    /// A list.
    More(Vec<String>),
}

impl OneOrMore {
    /// The strings, in order.
    pub fn list(&self) -> Vec<String> {
        match self {
            Self::One(one) => vec![one.clone()],
            Self::More(more) => more.clone(),
        }
    }
}

impl Value for OneOrMore {
    fn kind() -> String {
        "string, or list of strings".to_owned()
    }
    fn show(&self) -> String {
        match self {
            Self::One(one) => one.show(),
            Self::More(more) => more.show(),
        }
    }
}

/// What a list of `kind` holds: `IP addresses`, `addresses and ports`, `integers`.
fn plural(kind: &str) -> String {
    if let Some(stem) = kind.strip_suffix("address and port") {
        format!("{stem}addresses and ports")
    } else if kind.ends_with("address") {
        format!("{kind}es")
    } else {
        format!("{kind}s")
    }
}

/// Declares a table of a configuration file: each key once, as
/// `/// doc` `name: Type = default,` (or `name: Type,` for a key that must be written). It
/// makes:
///
/// - the struct, whose fields are the keys, read by serde: unknown keys are refused, a key
///   left out takes its default, a required one left out is an error;
/// - with `(optional)` after the table's name, `Default` (an empty table: every key must then
///   have a default);
/// - an associated constant per key, its dotted name (`RawDhcp::lease_time` is
///   `"dhcp.lease_time"`), for the checks' errors;
/// - [`Value`](crate::Value), which lists the table in the configuration [`Reference`].
///
/// The table's own doc comment opens its section of the reference; the calling crate needs
/// `serde`. A key's type is a [`Value`](crate::Value); `Spanned<T>` keeps where it was
/// written, for the checks' errors ([`unwritten`](crate::unwritten) makes a default one).
///
/// ```
/// use cyphonic_declare::{Given, Reference, unwritten};
/// use toml::Spanned;
///
/// cyphonic_declare::table! {
///     /// `[dhcp]`: the DHCP server.
///     pub struct RawDhcp in "dhcp" (optional) {
///         /// Serve DHCP.
///         enabled: bool = true,
///         /// Lease time, seconds.
///         lease_time: Spanned<u32> = unwritten(3600),
///     }
/// }
/// cyphonic_declare::table! {
///     /// The file.
///     pub struct File in "" {
///         /// The interface.
///         lan: String,
///         /// DHCP.
///         dhcp: RawDhcp = RawDhcp::default(),
///     }
/// }
///
/// let file: File = toml::from_str("lan = \"eth1\"\n[dhcp]\nlease_time = 60\n").unwrap();
/// assert_eq!(*file.dhcp.lease_time.get_ref(), 60);
/// assert!(file.dhcp.enabled);
/// assert_eq!(RawDhcp::lease_time, "dhcp.lease_time");
/// assert!(toml::from_str::<File>("").unwrap_err().message().contains("missing field `lan`"));
/// assert!(toml::from_str::<File>("lan = \"\"\nwan = 1").is_err());
///
/// let reference = Reference::of::<File>();
/// assert_eq!(reference.names(), ["lan", "dhcp.enabled", "dhcp.lease_time"]);
/// assert_eq!(reference.unset_in("lan = \"eth1\"\n[dhcp]\nenabled = true\n"), ["dhcp.lease_time"]);
/// let commented = "lan = \"eth1\"\n# [dhcp]\n# enabled = true\n";
/// assert_eq!(reference.unshown_in(commented), ["dhcp.lease_time"]);
/// assert_eq!(reference.tables[1].keys[1].default, Given::Value("3600".into()));
/// assert_eq!(reference.tables[0].keys[0].default, Given::Required);
/// ```
#[macro_export]
macro_rules! table {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident in $table:tt (optional) {
            $( $(#[doc = $kdoc:literal])* $key:ident : $ty:ty = $default:expr ),* $(,)?
        }
    ) => {
        $crate::table! {
            @struct [$($doc)*] $vis $name $table true
            { $( [$($kdoc)*] $key : $ty = $default ; )* }
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $key: $default, )* }
            }
        }
    };
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident in $table:tt {
            $( $(#[doc = $kdoc:literal])* $key:ident : $ty:ty $(= $default:expr)? ),* $(,)?
        }
    ) => {
        $crate::table! {
            @struct [$($doc)*] $vis $name $table false
            { $( [$($kdoc)*] $key : $ty $(= $default)? ; )* }
        }
    };
    (
        @struct [$($doc:literal)*] $vis:vis $name:ident $table:tt $optional:literal
        { $( [$($kdoc:literal)*] $key:ident : $ty:ty $(= $default:expr)? ; )* }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        $vis struct $name {
            $( $(#[doc = $kdoc])* $key: $ty, )*
        }

        const _: () = {
            use $crate::__private::serde;

            /// The table as serde reads it: every key optional.
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Table {
                $( $key: Option<$ty>, )*
            }

            impl<'de> serde::Deserialize<'de> for $name {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    let table = <Table as serde::Deserialize>::deserialize(d)?;
                    Ok(Self {
                        $(
                            $key: match table.$key {
                                Some(value) => value,
                                None => $crate::table!(@default $key $($default)?),
                            },
                        )*
                    })
                }
            }

            impl $crate::Value for $name {
                fn kind() -> String {
                    "table".to_owned()
                }
                fn show(&self) -> String {
                    String::new()
                }
                fn tables(
                    out: &mut $crate::Reference,
                    at: &str,
                    array: bool,
                    optional: bool,
                ) -> bool {
                    // Where the holding table put it, else where it was declared: one
                    // declaration may serve at several places (`legacy`, `vlan.legacy`).
                    let name = if at.is_empty() { $table } else { at }.to_owned();
                    let index = out.tables.len();
                    out.tables.push($crate::TableDoc {
                        name: name.clone(),
                        array,
                        optional: optional && $optional,
                        doc: $crate::doc_text(&[$($doc),*]),
                        keys: Vec::new(),
                    });
                    $(
                        let nested = <$ty as $crate::Value>::tables(
                            out,
                            &match name.as_str() {
                                "" => stringify!($key).to_owned(),
                                table => format!("{table}.{}", stringify!($key)),
                            },
                            false,
                            $crate::table!(@has_default $($default)?),
                        );
                        if !nested {
                            let default = $crate::table!(@given $ty $(= $default)?);
                            out.tables[index].keys.push($crate::KeyDoc {
                                name: stringify!($key),
                                kind: <$ty as $crate::Value>::kind(),
                                default,
                                doc: $crate::doc_text(&[$($kdoc),*]),
                            });
                        }
                    )*
                    true
                }
            }
        };

        #[allow(dead_code, non_upper_case_globals)]
        impl $name {
            $(
                #[doc = concat!("`", $table, ".", stringify!($key), "`: its name in errors.")]
                $vis const $key: &'static str = $crate::table!(@name $table $key);
            )*
        }
    };
    (@default $key:ident $default:expr) => { $default };
    (@default $key:ident) => {
        return Err($crate::__private::serde::de::Error::missing_field(stringify!($key)))
    };
    (@has_default $default:expr) => { true };
    (@has_default) => { false };
    (@given $ty:ty = $default:expr) => {{
        let value: $ty = $default;
        match $crate::Value::show(&value) {
            shown if shown.is_empty() => $crate::Given::Unset,
            shown => $crate::Given::Value(shown),
        }
    }};
    (@given $ty:ty) => { $crate::Given::Required };
    (@name "" $key:ident) => { stringify!($key) };
    (@name $table:tt $key:ident) => { concat!($table, ".", stringify!($key)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_names_what_it_holds_in_the_plural() {
        assert_eq!(<Vec<IpAddr>>::kind(), "list of IP addresses");
        assert_eq!(<Vec<SocketAddr>>::kind(), "list of addresses and ports");
        assert_eq!(<Vec<Spanned<u8>>>::kind(), "list of integers");
    }

    #[test]
    fn an_item_of_an_array_is_named_by_its_index() {
        assert_eq!(indexed("peer.endpoint", 2), "peer[2].endpoint");
        assert_eq!(indexed("policy.group.name", 0), "policy.group[0].name");
    }

    #[test]
    fn a_stale_generated_file_is_written_and_reported() {
        let path = std::env::temp_dir().join(format!("declare-{}.md", std::process::id()));
        let _ = std::fs::remove_file(&path);
        assert!(
            ensure_file(&path, "one").is_err(),
            "a missing file is stale"
        );
        assert_eq!(ensure_file(&path, "one"), Ok(()));
        assert!(ensure_file(&path, "two").is_err());
        assert_eq!(std::fs::read_to_string(&path).ok().as_deref(), Some("two"));
        let _ = std::fs::remove_file(&path);
    }
}

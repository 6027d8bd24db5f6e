//! Repository consistency checks: the code map, crate headers, layers, sans-IO, units. They run
//! as tests inside `cargo test` and alone as `cargo xtask tidy`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize as _;

use crate::util;

/// Our crates, their layer (ARCHITECTURE.md's table), and whether they may contain `unsafe`.
/// A crate missing here fails the layering check: adding a crate means placing it.
const LAYERS: &[(&str, u8, bool)] = &[
    ("cyphonic-wire", 0, false),
    ("cyphonic-declare", 0, false),
    ("cyphonic-crypto", 0, false),
    ("cyphonic-session", 1, false),
    ("cyphonic-gateway", 1, false),
    ("cyphonic-vip", 1, false),
    ("cyphonic-ha", 1, false),
    ("cyphonic-filter", 0, false),
    ("cyphonic-netstack", 0, false),
    ("cyphonic-resolver", 1, false),
    ("cyphonic-control", 1, false),
    ("cyphonic-pipeline", 2, false),
    ("cyphonic-netio", 2, true),
    ("cyphonic-telemetry", 2, false),
    ("cyphonic-signal", 3, false),
    ("cyphonic-cloud", 3, false),
    ("cyphonic-stream", 3, false),
    ("cyphonic-portmap", 3, false),
    ("cyphonic-tunnel", 3, false),
    ("cyphonic-offload", 3, false),
    ("cyphonic-settings", 4, false),
    ("cyphonic-daemon", 5, false),
    ("cyphonic-node", 6, false),
    ("cyphonic-adapter", 6, false),
];

/// Crates that must stay sans-IO: no clock, no sockets, no threads of their own.
const SANS_IO: &[&str] = &[
    "crates/wire",
    "crates/crypto",
    "crates/session",
    "crates/gateway",
    "crates/vip",
    "crates/ha",
    "crates/filter",
    "crates/resolver",
    "crates/control",
    "crates/netstack",
];

/// Crates below layer 3 must not pull in an async runtime...
const NO_TOKIO_BELOW: u8 = 3;

/// ...but for these, each with why: a runtime inside, none in its API.
const TOKIO_INSIDE: &[(&str, &str)] = &[(
    "cyphonic-telemetry",
    "its metrics endpoint serves HTTP with hyper on a runtime of its own thread",
)];

pub(crate) fn run() -> anyhow::Result<()> {
    let root = util::root();
    let mut problems = check_all(&root)?;
    problems.extend(host_only_profile(&root)?);
    if problems.is_empty() {
        eprintln!("xtask: tidy: all checks passed");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("{} tidy problem(s)", problems.len())
}

fn check_all(root: &Path) -> anyhow::Result<Vec<String>> {
    let members = members(root)?;
    let mut problems = Vec::new();
    problems.extend(architecture_map(root, &members)?);
    problems.extend(source_headers(root, &members)?);
    problems.extend(layering(root, &members)?);
    problems.extend(sans_io(root)?);
    problems.extend(units(root)?);
    problems.extend(import_circles(root, &members)?);
    problems.extend(outside_references(root, &members)?);
    Ok(problems)
}

/// The platforms whose dependency graphs [`host_only_profile`] reads: this machine's and
/// the Pi's.
const PLATFORMS: [&str; 2] = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"];

/// Cargo.toml's `[profile.dev.package]` names every package that runs only inside the
/// compiler (proc macros, and what they and build scripts use) with `opt-level = 0`, and
/// nothing else beside `"*"`: otherwise `"*"`'s opt-level 2 applies to them (it wins over
/// `build-override`), which costs more to compile than they save when they run.
fn host_only_profile(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut cmd = util::cargo_command();
    cmd.args(["metadata", "--format-version", "1", "--locked"]);
    for p in PLATFORMS {
        cmd.args(["--filter-platform", p]);
    }
    let out = cmd
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading cargo metadata")?;
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))?.parse()?;
    let listed = manifest
        .get("profile")
        .and_then(|p| p.get("dev"))
        .and_then(|d| d.get("package"))
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    Ok(profile_problems(&host_only(&meta)?, &listed))
}

/// The names of the packages in `meta`'s graph that are built only for the compiler: not
/// reached from a workspace member through normal or dev dependencies without passing a
/// proc macro. A name that also has a version built for the target is left out (an
/// override by name would apply to both).
fn host_only(meta: &serde_json::Value) -> anyhow::Result<std::collections::BTreeSet<String>> {
    use std::collections::{BTreeSet, HashMap, HashSet};
    let meta = Metadata::deserialize(meta).context("reading cargo metadata")?;
    let name: HashMap<&String, &String> = meta.packages.iter().map(|p| (&p.id, &p.name)).collect();
    let proc_macro: HashSet<&String> = meta
        .packages
        .iter()
        .filter(|p| {
            p.targets
                .iter()
                .any(|t| t.kind.iter().any(|k| k == "proc-macro"))
        })
        .map(|p| &p.id)
        .collect();
    // Each package's dependencies, and whether each is built for the target (a normal or
    // dev edge; `kind` is null for a normal one).
    let deps: HashMap<&String, Vec<(&String, bool)>> = meta
        .resolve
        .nodes
        .iter()
        .map(|n| {
            let out = n
                .deps
                .iter()
                .map(|d| {
                    let for_target = d
                        .dep_kinds
                        .iter()
                        .any(|k| k.kind.is_null() || k.kind.as_str() == Some("dev"));
                    (&d.pkg, for_target)
                })
                .collect();
            (&n.id, out)
        })
        .collect();
    let mut target: HashSet<&String> = HashSet::new();
    let mut stack: Vec<&String> = meta.workspace_members.iter().collect();
    while let Some(id) = stack.pop() {
        if !target.insert(id) {
            continue;
        }
        for (dep, for_target) in deps.get(id).into_iter().flatten() {
            if *for_target && !proc_macro.contains(dep) {
                stack.push(dep);
            }
        }
    }
    let target_names: HashSet<&String> = target
        .iter()
        .filter_map(|id| name.get(id))
        .copied()
        .collect();
    Ok(deps
        .keys()
        .filter(|id| !target.contains(*id))
        .filter_map(|id| name.get(id))
        .filter(|n| !target_names.contains(*n))
        .map(|n| (*n).clone())
        .collect::<BTreeSet<_>>())
}

/// What [`host_only`] reads of `cargo metadata`'s output; every field is required.
#[derive(Debug, serde::Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    resolve: Resolve,
    workspace_members: Vec<String>,
}

#[derive(Debug, serde::Deserialize)]
struct Package {
    id: String,
    name: String,
    targets: Vec<Target>,
}

#[derive(Debug, serde::Deserialize)]
struct Target {
    kind: Vec<String>,
}

#[derive(Debug, serde::Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Debug, serde::Deserialize)]
struct Node {
    id: String,
    deps: Vec<Dep>,
}

#[derive(Debug, serde::Deserialize)]
struct Dep {
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Debug, serde::Deserialize)]
struct DepKind {
    /// Null for a normal dependency, else `"dev"` or `"build"`; a `Value`, not an
    /// `Option`, so that a missing field is an error rather than a normal dependency.
    kind: serde_json::Value,
}

/// What is wrong with `listed` (Cargo.toml's `[profile.dev.package]`) given the `host`-only
/// packages.
fn profile_problems(
    host: &std::collections::BTreeSet<String>,
    listed: &toml::Table,
) -> Vec<String> {
    let zero: toml::Table = [("opt-level".to_owned(), toml::Value::Integer(0))]
        .into_iter()
        .collect();
    let mut problems = Vec::new();
    for h in host {
        if !listed.contains_key(h) {
            problems.push(format!(
                "Cargo.toml: `{h}` runs only inside the compiler; add `{h} = {{ opt-level = 0 }}` \
                 to [profile.dev.package]"
            ));
        }
    }
    for (n, v) in listed {
        if n == "*" {
            continue;
        }
        if !host.contains(n) {
            problems.push(format!(
                "Cargo.toml: [profile.dev.package] names `{n}`, which is not a package built \
                 only for the compiler (any more): remove it"
            ));
        } else if v.as_table() != Some(&zero) {
            problems.push(format!(
                "Cargo.toml: [profile.dev.package] `{n}` should be {{ opt-level = 0 }}, not {v}"
            ));
        }
    }
    problems
}

/// Names of files that readers of this repository do not have: the team's own notes (spelt
/// in two halves so that this file does not cite them).
const OUTSIDE: &[&str] = &[
    concat!("style", ".md"),
    concat!("design", ".md"),
    concat!("../", "shared"),
];

/// No source file or document cites a file outside the repository: a reader could not
/// follow it.
fn outside_references(root: &Path, members: &[String]) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    for member in members {
        let dir = root.join(member);
        for sub in ["src", "tests", "benches"] {
            if dir.join(sub).is_dir() {
                files.extend(rust_files(&dir.join(sub))?);
            }
        }
    }
    for dir in [root.to_path_buf(), root.join("docs")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for name in OUTSIDE.iter().filter(|n| text.contains(**n)) {
            let shown = file.strip_prefix(root).unwrap_or(&file).display();
            problems.push(format!(
                "{shown} cites {name}, which is not in the repository"
            ));
        }
    }
    Ok(problems)
}

/// The files of each crate form a tree of imports: no file imports, through any chain of
/// paths, a file that imports it back. The crate root (lib.rs, or main.rs without one)
/// takes part: it imports a module whose items its own code uses (by a path, or by a name
/// it re-exports from there), and a module imports it by using an item the root defines.
/// Re-exports alone (the root as a table of contents) and code below `#[cfg(test)]` do not
/// count.
fn import_circles(root: &Path, members: &[String]) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for member in members {
        let src = root.join(member).join("src");
        if !src.exists() {
            continue;
        }
        let mut modules = crate_modules(&src)?;
        let root_file = ["lib", "main"]
            .into_iter()
            .find(|r| src.join(format!("{r}.rs")).exists());
        let root_code = match root_file {
            Some(r) => code_of(&std::fs::read_to_string(src.join(format!("{r}.rs")))?),
            None => String::new(),
        };
        let names: Vec<String> = modules.iter().map(|(m, _)| m.clone()).collect();
        let mut edges: Vec<Vec<usize>> = modules
            .iter()
            .map(|(_, text)| {
                let code = code_of(text);
                names
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| imports(&code, n))
                    .map(|(i, _)| i)
                    .collect()
            })
            .collect();
        if let Some(r) = root_file {
            let at = modules.len();
            let (body, reexported) = root_parts(&root_code);
            let defined = defined_items(&root_code);
            for ((name, text), out) in modules.iter().zip(edges.iter_mut()) {
                let top_level = !name.contains('/');
                let code = code_of(text);
                if uses_root_item(&code, &defined, top_level) {
                    out.push(at);
                }
            }
            let from_root = names
                .iter()
                .enumerate()
                .filter(|(_, n)| {
                    let top = n.split('/').next().unwrap_or_default();
                    word_at(&body, &format!("{top}::"))
                        || reexported
                            .iter()
                            .any(|(m, item)| m == top && word_at(&body, item))
                })
                .map(|(i, _)| i)
                .collect();
            edges.push(from_root);
            modules.push((r.to_owned(), String::new()));
        }
        if let Some(circle) = find_circle(&edges) {
            let shown: Vec<String> = circle
                .iter()
                .map(|i| format!("{member}/src/{}.rs", modules[*i].0))
                .collect();
            problems.push(format!("import circle: {}", shown.join(" -> ")));
        }
    }
    Ok(problems)
}

/// A crate root's code without its `mod` declarations and `pub use` re-exports, and what
/// those re-exports bring in, as (module, name) pairs.
fn root_parts(code: &str) -> (String, Vec<(String, String)>) {
    let mut body = String::new();
    let mut reexported = Vec::new();
    let mut rest = code;
    while let Some(at) = ["pub use ", "pub(crate) use "]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        body.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |e| at + e + 1);
        let statement = &rest[at..end];
        let path = statement
            .split_once(" use ")
            .map_or("", |(_, p)| p)
            .trim_end_matches(';')
            .trim();
        let path = path.strip_prefix("crate::").unwrap_or(path);
        if let Some((module, items)) = path.split_once("::") {
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                let item = item.trim();
                let name = item
                    .rsplit_once(" as ")
                    .map_or_else(|| item.rsplit("::").next().unwrap_or(item), |(_, a)| a);
                if !name.is_empty() {
                    reexported.push((module.to_owned(), name.trim().to_owned()));
                }
            }
        }
        rest = &rest[end..];
    }
    body.push_str(rest);
    let body = body
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            let t = t.strip_prefix("pub ").unwrap_or(t);
            !(t.starts_with("mod ") && t.trim_end().ends_with(';'))
        })
        .collect::<Vec<_>>()
        .join("\n");
    (body, reexported)
}

/// The names a crate root defines at its top level (types, functions, constants, traits,
/// macros; not the methods of its types, which are indented).
fn defined_items(code: &str) -> Vec<String> {
    const KINDS: [&str; 8] = [
        "struct ",
        "enum ",
        "fn ",
        "const ",
        "trait ",
        "type ",
        "static ",
        "macro_rules! ",
    ];
    code.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| {
            let mut t = l;
            for prefix in ["pub(crate) ", "pub ", "const ", "unsafe "] {
                t = t.strip_prefix(prefix).unwrap_or(t);
            }
            let rest = KINDS.iter().find_map(|k| t.strip_prefix(k))?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Whether a module's `code` uses an item of the crate root: `crate::Item`,
/// `crate::{Item, ..}`, or for a module just below the root `super::Item`.
fn uses_root_item(code: &str, defined: &[String], top_level: bool) -> bool {
    let prefixes: &[&str] = if top_level {
        &["crate::", "super::"]
    } else {
        &["crate::"]
    };
    prefixes.iter().any(|prefix| {
        heads_after(code, prefix)
            .iter()
            .any(|h| defined.iter().any(|d| d == h))
    })
}

/// The first segment of each path that follows `prefix` in `code`: `crate::a::X` gives `a`,
/// `crate::{a::X, B}` gives `a` and `B`.
fn heads_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.split(prefix)
        .skip(1)
        .flat_map(|after| match after.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|i| i.trim().split("::").next().unwrap_or_default())
                .collect(),
            None => vec![
                after
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default(),
            ],
        })
        .collect()
}

/// Whether `text` holds `word` whole: no letter, digit or `_` right after it (none is looked
/// for after a word that ends in `::`), nor right before it when it starts with one.
fn word_at(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, m)| {
        let before = text[..i].chars().next_back();
        let after = text[i + m.len()..].chars().next();
        !(word.starts_with(ident) && before.is_some_and(ident))
            && (word.ends_with("::") || !after.is_some_and(ident))
    })
}

/// The modules of a crate as (path below `src` without `.rs`, e.g. `bin/x` or `a/b`, text),
/// without the crate roots.
fn crate_modules(src: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for file in rust_files(src)? {
        let rel = file.strip_prefix(src).unwrap_or(&file).with_extension("");
        let name = rel.to_string_lossy().replace('\\', "/");
        let name = name.strip_suffix("/mod").unwrap_or(&name).to_owned();
        if ["lib", "main"].contains(&name.as_str()) || name.starts_with("bin/") {
            continue;
        }
        out.push((name, std::fs::read_to_string(&file)?));
    }
    out.sort();
    Ok(out)
}

/// A file's code as the checks read it: what comes before its tests (which sit at
/// the bottom), without comment lines.
fn code_of(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` names module `module` through a `crate::` path (`use crate::a::X`,
/// `crate::a::f()`, `use crate::{a, b}`).
fn imports(code: &str, module: &str) -> bool {
    let path = module.replace('/', "::");
    word_at(code, &format!("crate::{path}"))
        || heads_after(code, "crate::").contains(&path.as_str())
}

/// A circle in the graph `edges` (node -> nodes), as the nodes along it, if there is one.
fn find_circle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    // 0: not seen, 1: on the current path, 2: done.
    fn visit(
        n: usize,
        edges: &[Vec<usize>],
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[n] = 1;
        path.push(n);
        for &m in &edges[n] {
            if m == n {
                continue;
            }
            if state[m] == 1 {
                let start = path.iter().position(|&p| p == m).unwrap_or_default();
                let mut circle = path[start..].to_vec();
                circle.push(m);
                return Some(circle);
            }
            if state[m] == 0
                && let Some(c) = visit(m, edges, state, path)
            {
                return Some(c);
            }
        }
        path.pop();
        state[n] = 2;
        None
    }
    let mut state = vec![0u8; edges.len()];
    (0..edges.len()).find_map(|n| {
        (state[n] == 0)
            .then(|| visit(n, edges, &mut state, &mut Vec::new()))
            .flatten()
    })
}

/// Capabilities a unit may grant: raw and admin network access (the adapter's AF_PACKET and
/// offload switches, the node's TUN), and binding port 53 (the node's DNS stub).
const ALLOWED_CAPS: [&str; 3] = ["CAP_NET_RAW", "CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE"];

/// The systemd units in config/ (every file there is read by a test): each
/// runs its program from /usr/bin with its /etc/cyphonic configuration as the user
/// `cyphonic`, restarts on failure, keeps the file system read-only but for its state, and
/// grants no capability beyond [`ALLOWED_CAPS`] (and the same in the bounding set).
fn units(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let dir = root.join("config");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(problems);
    };
    for entry in entries {
        let path = entry?.path();
        let Some(program) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".service"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path)?;
        let mut section = String::new();
        let mut keys: Vec<(String, String, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if let Some((k, v)) = line.split_once('=') {
                keys.push((section.clone(), k.trim().to_owned(), v.trim().to_owned()));
            } else {
                problems.push(format!("{}:{}: not `key=value`", path.display(), i + 1));
            }
        }
        let get = |s: &str, k: &str| {
            keys.iter()
                .filter(|(sec, key, _)| sec == s && key == k)
                .map(|(_, _, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        let mut expect = |ok: bool, what: String| {
            if !ok {
                problems.push(format!("{}: {what}", path.display()));
            }
        };
        let short = program.trim_start_matches("cyphonic-");
        let exec = get("Service", "ExecStart").join(" ");
        expect(
            exec.starts_with(&format!("/usr/bin/{program} "))
                && exec.contains(&format!("/etc/cyphonic/{short}.toml")),
            format!(
                "ExecStart must run /usr/bin/{program} with /etc/cyphonic/{short}.toml, not {exec:?}"
            ),
        );
        expect(
            !get("Unit", "Description").is_empty(),
            "no Description".into(),
        );
        for (section, key, value) in [
            ("Service", "User", "cyphonic"),
            ("Service", "Restart", "on-failure"),
            ("Service", "ProtectSystem", "strict"),
            ("Service", "NoNewPrivileges", "yes"),
            ("Install", "WantedBy", "multi-user.target"),
        ] {
            expect(
                get(section, key) == [value],
                format!("{key} must be {value}"),
            );
        }
        let caps = |k: &str| -> Vec<String> {
            get("Service", k)
                .iter()
                .flat_map(|v| v.split_whitespace())
                .map(str::to_owned)
                .collect()
        };
        let (ambient, bounding) = (caps("AmbientCapabilities"), caps("CapabilityBoundingSet"));
        expect(
            get("Service", "CapabilityBoundingSet").len() == 1,
            "CapabilityBoundingSet must be given (once)".into(),
        );
        expect(
            ambient.iter().all(|c| ALLOWED_CAPS.contains(&c.as_str())) && ambient == bounding,
            format!(
                "capabilities {ambient:?} (bounding {bounding:?}): only {ALLOWED_CAPS:?}, the same in both"
            ),
        );
    }
    Ok(problems)
}

/// Workspace member directories, relative to the root.
fn members(root: &Path) -> anyhow::Result<Vec<String>> {
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml"))?)?;
    let list = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .context("root Cargo.toml has no workspace.members")?;
    Ok(list
        .iter()
        .filter_map(toml::Value::as_str)
        .map(str::to_owned)
        .collect())
}

fn package_name(root: &Path, member: &str) -> anyhow::Result<(String, toml::Table)> {
    let path = root.join(member).join("Cargo.toml");
    let manifest: toml::Table = toml::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    let name = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(toml::Value::as_str)
        .with_context(|| format!("{} has no package.name", path.display()))?
        .to_owned();
    Ok((name, manifest))
}

/// ARCHITECTURE.md stays a true map (hickory's drifted one is the counter-example): a section
/// for every workspace member, every path it names exists, every `file.rs:function` hop
/// names a function of that file, its layers table is [`LAYERS`], and it points at nothing
/// outside the repository.
fn architecture_map(root: &Path, members: &[String]) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;
    let mut problems: Vec<String> = members
        .iter()
        .filter(|m| !text.contains(&format!("### `{m}`")))
        .map(|m| format!("ARCHITECTURE.md code map does not describe `{m}`"))
        .collect();
    if text.contains("../") {
        problems.push("ARCHITECTURE.md names a file outside the repository (../)".into());
    }
    // A span is read in the section it appears in: `capture.rs` under `adapter-daemon` is
    // adapter-daemon/src/capture.rs.
    let mut section = String::new();
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("### `") {
            section = heading.trim_end_matches('`').to_string();
        }
        for span in line.split('`').skip(1).step_by(2) {
            problems.extend(named_in_map(root, &section, span));
        }
    }
    problems.extend(layers_table(&text));
    Ok(problems)
}

/// What is wrong with one code span of the map: a path that does not exist, or a hop
/// (`path.rs:item` or `path.rs:Type::method`) whose function the file does not define.
fn named_in_map(root: &Path, section: &str, span: &str) -> Option<String> {
    let (path, item) = match span.split_once(".rs:") {
        Some((file, item)) => (format!("{file}.rs"), Some(item)),
        None => (span.to_string(), None),
    };
    let is_path = path.contains('/') || path.ends_with(".rs");
    if !is_path
        || !path.starts_with(|c: char| c.is_ascii_alphanumeric())
        || path.contains(char::is_whitespace)
        || path.contains("::")
    {
        return None;
    }
    let found = [
        root.join(&path),
        root.join(section).join(&path),
        root.join(section).join("src").join(&path),
    ]
    .into_iter()
    .find(|p| p.exists());
    let Some(file) = found else {
        return Some(format!(
            "ARCHITECTURE.md names `{span}`, which does not exist"
        ));
    };
    let item = item?;
    let code = std::fs::read_to_string(&file).map(|t| code_of(&t)).ok()?;
    let (owner, function) = match item.rsplit_once("::") {
        Some((owner, function)) => (Some(owner), function),
        None => (None, item),
    };
    let defines_fn = defined(&code, &["fn "], function);
    let defines_owner = owner.is_none_or(|o| {
        defined(
            &code,
            &["struct ", "trait ", "enum ", "impl ", "for ", "> "],
            o,
        )
    });
    (!defines_fn || !defines_owner)
        .then(|| format!("ARCHITECTURE.md names `{span}`, which that file does not define"))
}

/// Whether `code` has `name` as a whole word right after one of `before`.
fn defined(code: &str, before: &[&str], name: &str) -> bool {
    before.iter().any(|b| word_at(code, &format!("{b}{name}")))
}

/// The map's table of layers (`| 3 | signal, cloud |`) says what [`LAYERS`] enforces.
fn layers_table(text: &str) -> Vec<String> {
    let mut shown: Vec<(String, u8)> = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, layer, crates, _] = cells[..] else {
            continue;
        };
        let Ok(layer) = layer.parse::<u8>() else {
            continue;
        };
        shown.extend(crates.split(',').map(|c| (c.trim().to_string(), layer)));
    }
    let mut problems = Vec::new();
    for (name, layer, _) in LAYERS {
        let short = name.trim_start_matches("cyphonic-");
        match shown.iter().find(|(c, _)| c == short) {
            Some((_, l)) if l == layer => {}
            Some((_, l)) => problems.push(format!(
                "ARCHITECTURE.md puts {short} in layer {l}, tidy in layer {layer}"
            )),
            None => problems.push(format!("ARCHITECTURE.md's layers table lacks {short}")),
        }
    }
    for (c, _) in &shown {
        if !LAYERS
            .iter()
            .any(|(n, _, _)| n.trim_start_matches("cyphonic-") == c)
        {
            problems.push(format!(
                "ARCHITECTURE.md's layers table names {c}, which tidy does not"
            ));
        }
    }
    problems
}

/// Every crate root opens with `//!` docs; all but the I/O crate forbid `unsafe`.
fn source_headers(root: &Path, members: &[String]) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for member in members {
        let (name, _) = package_name(root, member)?;
        let may_be_unsafe = LAYERS
            .iter()
            .any(|(n, _, unsafe_ok)| *n == name && *unsafe_ok);
        for file in ["src/lib.rs", "src/main.rs"] {
            let path = root.join(member).join(file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let shown = format!("{member}/{file}");
            if !text.trim_start().starts_with("//!") {
                problems.push(format!("{shown} does not open with //! crate docs"));
            }
            if !may_be_unsafe && !text.contains("#![forbid(unsafe_code)]") {
                problems.push(format!("{shown} lacks #![forbid(unsafe_code)]"));
            }
        }
    }
    Ok(problems)
}

/// Dependencies between our crates point down the layers only; netio uses none of ours;
/// nothing below layer 3 uses tokio.
fn layering(root: &Path, members: &[String]) -> anyhow::Result<Vec<String>> {
    let layer = |name: &str| {
        LAYERS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, l, _)| *l)
    };
    let mut problems = Vec::new();
    for member in members {
        let (name, manifest) = package_name(root, member)?;
        // Test harnesses (benchmarks, the real-kernel tier, its reports) may use anything;
        // nothing of the product uses them.
        if !name.starts_with("cyphonic-")
            || ["cyphonic-benches", "cyphonic-e2e", "cyphonic-report"].contains(&name.as_str())
        {
            continue;
        }
        let Some(own) = layer(&name) else {
            problems.push(format!(
                "{name} is not placed in a layer (xtask/src/tidy.rs LAYERS)"
            ));
            continue;
        };
        let deps = manifest
            .get("dependencies")
            .and_then(toml::Value::as_table)
            .cloned()
            .unwrap_or_default();
        for dep in deps.keys() {
            if dep == "tokio"
                && own < NO_TOKIO_BELOW
                && !TOKIO_INSIDE.iter().any(|(n, _)| *n == name)
            {
                problems.push(format!(
                    "{name} (layer {own}) depends on tokio; async starts at layer 3"
                ));
            }
            if !dep.starts_with("cyphonic-") {
                continue;
            }
            match layer(dep) {
                None => problems.push(format!("{name} depends on {dep}, which is not placed in a layer")),
                Some(_) if name == "cyphonic-netio" => problems.push(format!("netio must not depend on our crates, found {dep}")),
                Some(l) if l >= own => problems.push(format!("{name} (layer {own}) depends on {dep} (layer {l}): dependencies point down only")),
                Some(_) => {}
            }
        }
    }
    Ok(problems)
}

/// Sans-IO crates read no clock and open no socket outside their tests.
fn sans_io(root: &Path) -> anyhow::Result<Vec<String>> {
    const FORBIDDEN: &[&str] = &[
        "Instant::now",
        "SystemTime::now",
        "UdpSocket",
        "TcpStream",
        "TcpListener",
        "std::thread::spawn",
        "thread::spawn",
    ];
    let mut problems = Vec::new();
    for krate in SANS_IO {
        let src = root.join(krate).join("src");
        if !src.exists() {
            continue;
        }
        // A module of unit tests in a file of its own, as the crate root declares it
        // (`#[cfg(test)] mod tests;`), may use anything.
        let root_text = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
        let test_file = root_text
            .contains("#[cfg(test)]\nmod tests;")
            .then(|| src.join("tests.rs"));
        for file in rust_files(&src)? {
            if test_file.as_ref() == Some(&file) {
                continue;
            }
            let text = std::fs::read_to_string(&file)?;
            // Unit tests sit at the bottom of a file and may use anything;
            // comments may name what the code must not do.
            let code = code_of(&text);
            for word in FORBIDDEN {
                if code.contains(word) {
                    let shown = file
                        .strip_prefix(root)
                        .unwrap_or(&file)
                        .display()
                        .to_string();
                    problems.push(format!(
                        "{shown} uses {word}; {krate} is sans-IO (pass time and bytes in)"
                    ));
                }
            }
        }
    }
    Ok(problems)
}

fn rust_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_clean(problems: &[String]) {
        assert!(
            problems.is_empty(),
            "tidy problems:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn architecture_md_maps_every_member() {
        let root = util::root();
        assert_clean(&architecture_map(&root, &members(&root).unwrap()).unwrap());
    }

    #[test]
    fn crate_roots_have_docs_and_forbid_unsafe() {
        let root = util::root();
        assert_clean(&source_headers(&root, &members(&root).unwrap()).unwrap());
    }

    #[test]
    fn dependencies_point_down_the_layers() {
        let root = util::root();
        assert_clean(&layering(&root, &members(&root).unwrap()).unwrap());
    }

    #[test]
    fn systemd_units_are_hardened() {
        assert_clean(&units(&util::root()).unwrap());
    }

    #[test]
    fn no_import_circles_between_files() {
        let root = util::root();
        assert_clean(&import_circles(&root, &members(&root).unwrap()).unwrap());
    }

    /// The crate root takes part in the circle check: through a path or a re-exported name
    /// its code uses, not through re-exports alone nor through its types' methods.
    #[test]
    fn circles_through_the_crate_root_are_found() {
        let dir = std::env::temp_dir().join(format!("cyphonic-tidy-root-{}", std::process::id()));
        let src = dir.join("crates/x/src");
        std::fs::create_dir_all(&src).unwrap();
        let circles = |lib: &str, a: &str| {
            std::fs::write(src.join("lib.rs"), lib).unwrap();
            std::fs::write(src.join("a.rs"), a).unwrap();
            import_circles(&dir, &["crates/x".to_owned()]).unwrap()
        };
        let by_path = circles(
            "mod a;\npub struct Shared;\npub fn f() { a::g(); }\n",
            "use crate::Shared;\npub fn g() {}\n",
        );
        let by_name = circles(
            "mod a;\npub use a::Pool;\npub struct Shared {\n    pool: Pool,\n}\n",
            "pub struct Pool;\nfn f(_: &crate::Shared) {}\n",
        );
        let contents_only = circles(
            "mod a;\npub use a::{Pool, g};\npub struct Shared;\n",
            "pub struct Pool;\npub fn g(_: &crate::Shared) {}\n",
        );
        let method_named_like_a_module = circles(
            "mod a;\nmod rules;\npub struct S;\nimpl S {\n    pub fn rules(&self) { a::g() }\n}\n",
            "use crate::rules::Y;\npub fn g() {}\n",
        );
        let _ = std::fs::remove_dir_all(&dir);
        let circle = "import circle: crates/x/src/a.rs -> crates/x/src/lib.rs -> crates/x/src/a.rs";
        assert_eq!(by_path, [circle]);
        assert_eq!(by_name, [circle]);
        assert!(contents_only.is_empty(), "{contents_only:?}");
        assert!(
            method_named_like_a_module.is_empty(),
            "{method_named_like_a_module:?}"
        );
    }

    #[test]
    fn import_circles_are_found() {
        let code = |uses: &str| code_of(&format!("{uses}\n#[cfg(test)]\nuse crate::c;\n"));
        assert!(imports(&code("use crate::a::X;"), "a"));
        assert!(imports(&code("use crate::{a::X, b};"), "b"));
        assert!(!imports(&code("use crate::ab::X;"), "a"));
        assert!(
            !imports(&code("/// see [`crate::a`]"), "a"),
            "comments do not count"
        );
        assert!(!imports(&code(""), "c"), "test code does not count");
        assert_eq!(find_circle(&[vec![1], vec![2], vec![]]), None);
        assert_eq!(
            find_circle(&[vec![1], vec![2], vec![0]]),
            Some(vec![0, 1, 2, 0])
        );
    }

    #[test]
    fn compiler_only_packages_are_not_optimised() {
        assert_clean(&host_only_profile(&util::root()).unwrap());
    }

    /// A proc macro, what it uses, and a build script's dependency are host-only; a package
    /// also reached as a normal dependency is not, even through a build edge; the profile
    /// list is held to that set both ways.
    #[test]
    fn host_only_packages_are_found_and_listed() {
        let meta = serde_json::json!({
            "workspace_members": ["w"],
            "packages": [
                {"id": "w", "name": "w", "targets": [{"kind": ["lib"]}]},
                {"id": "m", "name": "m-derive", "targets": [{"kind": ["proc-macro"]}]},
                {"id": "s", "name": "syn", "targets": [{"kind": ["lib"]}]},
                {"id": "c", "name": "cc", "targets": [{"kind": ["lib"]}]},
                {"id": "l", "name": "libc", "targets": [{"kind": ["lib"]}]},
                {"id": "t", "name": "tokio", "targets": [{"kind": ["lib"]}]},
            ],
            "resolve": {"nodes": [
                {"id": "w", "deps": [
                    {"pkg": "m", "dep_kinds": [{"kind": null}]},
                    {"pkg": "c", "dep_kinds": [{"kind": "build"}]},
                    {"pkg": "l", "dep_kinds": [{"kind": "build"}, {"kind": null}]},
                    {"pkg": "t", "dep_kinds": [{"kind": "dev"}]},
                ]},
                {"id": "m", "deps": [{"pkg": "s", "dep_kinds": [{"kind": null}]}]},
                {"id": "s", "deps": []},
                {"id": "c", "deps": [{"pkg": "l", "dep_kinds": [{"kind": null}]}]},
                {"id": "l", "deps": []},
                {"id": "t", "deps": []},
            ]},
        });
        let host = host_only(&meta).unwrap();
        let mut without_kind = meta.clone();
        without_kind["resolve"]["nodes"][0]["deps"][1]["dep_kinds"][0] = serde_json::json!({});
        assert!(
            host_only(&without_kind).is_err(),
            "a dependency without its kind is not read as a normal one"
        );
        assert_eq!(
            host.iter().map(String::as_str).collect::<Vec<_>>(),
            ["cc", "m-derive", "syn"]
        );
        let listed: toml::Table = "\"*\" = { opt-level = 2 }\ncc = { opt-level = 0 }\n\
                                   syn = { opt-level = 1 }\ntokio = { opt-level = 0 }\n"
            .parse()
            .unwrap();
        let problems = profile_problems(&host, &listed);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("add `m-derive = { opt-level = 0 }`"));
        assert!(problems[1].contains("`syn` should be { opt-level = 0 }"));
        assert!(problems[2].contains("names `tokio`"));
    }

    #[test]
    fn nothing_cites_files_outside_the_repository() {
        let root = util::root();
        assert_clean(&outside_references(&root, &members(&root).unwrap()).unwrap());
    }

    #[test]
    fn sans_io_crates_read_no_clock_and_open_no_socket() {
        assert_clean(&sans_io(&util::root()).unwrap());
    }

    /// The checks themselves catch what they claim to (a check that cannot fail proves nothing).
    #[test]
    fn checks_detect_violations() {
        let dir = std::env::temp_dir().join(format!("cyphonic-tidy-{}", std::process::id()));
        let krate = dir.join("crates/wire");
        std::fs::create_dir_all(krate.join("src")).unwrap();
        std::fs::write(
            dir.join("Cargo.toml"),
            "[workspace]\nmembers = [\"crates/wire\"]\n",
        )
        .unwrap();
        std::fs::write(krate.join("Cargo.toml"), "[package]\nname = \"cyphonic-wire\"\n[dependencies]\ncyphonic-session = { path = \"x\" }\ntokio = \"1\"\n").unwrap();
        std::fs::write(krate.join("src/lib.rs"), concat!("/// Built from `Instant::now()` by the driver (style", ".md rule 1).\nfn f() { let _ = std::time::Instant::now(); }\n#[cfg(test)]\nmod t { fn g() { std::time::Instant::now(); } }\n")).unwrap();
        std::fs::write(
            dir.join("ARCHITECTURE.md"),
            "# x\nSee ../x.md.\n\
             | 1 | wire, crypto |\n| 9 | gone |\n\
             `crates/wire/src/lib.rs:f` and `crates/wire/src/lib.rs:Missing::f`, \
             `crates/wire/src/lib.rs:g`, `crates/wire/src/nowhere.rs`\n\
             ### `crates/session`\n`lib.rs`\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("config")).unwrap();
        std::fs::write(
            dir.join("config/cyphonic-adapter.service"),
            "[Service]\nExecStart=/usr/local/bin/x\nUser=root\nAmbientCapabilities=CAP_SYS_ADMIN\nCapabilityBoundingSet=CAP_SYS_ADMIN\n",
        )
        .unwrap();
        let problems = check_all(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let has = |s: &str| problems.iter().any(|p| p.contains(s));
        assert!(has("does not describe `crates/wire`"), "{problems:?}");
        assert!(has("outside the repository"), "{problems:?}");
        assert!(
            has(concat!("crates/wire/src/lib.rs cites style", ".md")),
            "{problems:?}"
        );
        assert!(has("puts wire in layer 1, tidy in layer 0"), "{problems:?}");
        assert!(has("names gone, which tidy does not"), "{problems:?}");
        assert!(has("layers table lacks session"), "{problems:?}");
        assert!(
            has("`crates/wire/src/lib.rs:Missing::f`, which"),
            "{problems:?}"
        );
        assert!(has("`crates/wire/src/lib.rs:g`, which"), "{problems:?}");
        assert!(has("`crates/wire/src/nowhere.rs`, which"), "{problems:?}");
        assert!(has("names `lib.rs`, which does not exist"), "{problems:?}");
        assert!(
            !has("`crates/wire/src/lib.rs:f`,"),
            "a function that is defined is found: {problems:?}"
        );
        assert!(has("does not open with //!"), "{problems:?}");
        assert!(has("lacks #![forbid(unsafe_code)]"), "{problems:?}");
        assert!(has("depends on cyphonic-session (layer 1)"), "{problems:?}");
        assert!(has("depends on tokio"), "{problems:?}");
        for unit in [
            "ExecStart must run /usr/bin/cyphonic-adapter",
            "User must be cyphonic",
            "ProtectSystem must be strict",
            "capabilities [\"CAP_SYS_ADMIN\"]",
        ] {
            assert!(has(unit), "{unit}: {problems:?}");
        }
        assert_eq!(
            problems
                .iter()
                .filter(|p| p.contains("Instant::now"))
                .count(),
            1,
            "{problems:?}"
        );
    }
}

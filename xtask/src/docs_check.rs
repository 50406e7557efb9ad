//! `cargo xtask docs`: what the documentation says must hold in the repository.
//!
//! - Markdown (README.md, CONTRIBUTING.md, docs/, deploy/): every relative link resolves,
//!   and its `#anchor` names a heading of the file it points to; every path named in
//!   backticks exists (a path with a placeholder — `<name>`, `*`, `{a,b}`, `…`, `$VAR` —
//!   is an example and is not looked up); every `redirector …` and `cargo xtask …`
//!   command line in a shell code block parses with the real command-line definitions.
//! - Rust sources: every repository path and every `*.md` file a comment cites exists,
//!   and no document outside the repository is cited.
//! - deploy/daemonset-linkerd.yaml is deploy/daemonset.yaml with the Linkerd dialect set
//!   (its comments aside).
//!
//! The command lines of `cargo xtask` are parsed with xtask's own clap definitions; those
//! of `redirector` by the built binary, run with the documented arguments and `--help`
//! after them: clap reads the arguments in order, so an unknown subcommand or flag, or a
//! value its parser refuses, fails before the help is printed, and with the help printed
//! the binary exits without doing anything else.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// One thing the docs or comments say that does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// The file, relative to the repository's root.
    pub(crate) file: PathBuf,
    /// 1-based.
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// Checks a command line (its words after the program's name); `Err` says why it does
/// not parse.
pub(crate) type ParseCheck<'a> = dyn FnMut(&[String]) -> Result<(), String> + 'a;

/// What a run checked, for its closing line.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    pub(crate) markdown_files: usize,
    pub(crate) links: usize,
    pub(crate) paths: usize,
    pub(crate) commands: usize,
    pub(crate) rust_files: usize,
    pub(crate) citations: usize,
}

/// The directories never looked into.
const SKIPPED_DIRS: [&str; 3] = ["target", ".git", "node_modules"];

/// The Markdown files the check reads: at the root, and everything under docs/ and deploy/.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() && path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    for dir in ["docs", "deploy"] {
        walk(&root.join(dir), &mut |p| {
            if p.extension().is_some_and(|e| e == "md") {
                files.push(p.to_path_buf());
            }
        });
    }
    files.sort();
    files
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if path.is_dir() {
            if !name.is_some_and(|n| SKIPPED_DIRS.contains(&n.as_str())) {
                walk(&path, visit);
            }
        } else {
            visit(&path);
        }
    }
}

/// The repository as the check sees it: its root, its top-level names, every file's name,
/// and the directories relative paths may be read from (the workspace members').
struct Repo {
    root: PathBuf,
    top_level: BTreeSet<String>,
    file_names: BTreeSet<String>,
    /// Every file, relative to the root, `/`-separated.
    files: Vec<String>,
    members: Vec<PathBuf>,
}

impl Repo {
    fn new(root: &Path) -> Repo {
        let mut top_level = BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !SKIPPED_DIRS.contains(&name.as_str()) {
                    top_level.insert(name);
                }
            }
        }
        let mut file_names = BTreeSet::new();
        let mut files = Vec::new();
        walk(root, &mut |p| {
            if let Some(n) = p.file_name() {
                file_names.insert(n.to_string_lossy().into_owned());
            }
            if let Ok(rel) = p.strip_prefix(root) {
                files.push(rel.to_string_lossy().into_owned());
            }
        });
        let members = top_level
            .iter()
            .map(|n| root.join(n))
            .filter(|d| d.join("Cargo.toml").is_file())
            .collect();
        Repo {
            root: root.to_path_buf(),
            top_level,
            file_names,
            files,
            members,
        }
    }

    fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root).unwrap_or(path).to_path_buf()
    }
}

/// Runs every check over the repository at `root`. `redirector` checks the words of a
/// `redirector …` command line, `xtask` those of a `cargo xtask …` one.
pub(crate) fn check(
    root: &Path,
    redirector: &mut ParseCheck<'_>,
    xtask: &mut ParseCheck<'_>,
) -> (Vec<Finding>, Checked) {
    let repo = Repo::new(root);
    let mut findings = Vec::new();
    let mut checked = Checked::default();
    let docs: Vec<(PathBuf, String)> = markdown_files(root)
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
        .collect();
    let mut anchors: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    for (path, text) in &docs {
        anchors.insert(path.clone(), heading_anchors(text));
    }
    let mut commands = Commands {
        redirector,
        xtask,
        seen: BTreeMap::new(),
    };
    for (path, text) in &docs {
        checked.markdown_files += 1;
        check_markdown(
            &repo,
            path,
            text,
            &mut anchors,
            &mut commands,
            &mut findings,
            &mut checked,
        );
    }
    findings.extend(linkerd_manifest(root));
    walk(root, &mut |p| {
        if p.extension().is_some_and(|e| e == "rs") {
            if let Ok(text) = std::fs::read_to_string(p) {
                checked.rust_files += 1;
                check_comments(&repo, p, &text, &mut commands, &mut findings, &mut checked);
            }
        }
    });
    (findings, checked)
}

// ---------------------------------------------------------------------------------------
// Markdown

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-`
/// and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (a repeated heading gets `-1`, `-2`, …), and
/// of its explicit `<a id=…>`/`<a name=…>` tags.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut fence: Option<String> = None;
    for line in text.lines() {
        if let Some(open) = fence_marker(line) {
            match &fence {
                Some(f) if open.starts_with(f.as_str()) && line.trim().len() == open.len() => {
                    fence = None
                }
                Some(_) => {}
                None => fence = Some(open),
            }
            continue;
        }
        if fence.is_some() {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let n = counts.entry(base.clone()).or_insert(0);
            anchors.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    anchors.insert(rest[..end].to_string());
                }
            }
        }
    }
    anchors
}

/// The fence (```` ``` ```` or `~~~`, three or more) a line opens or closes a code block
/// with, if it does.
fn fence_marker(line: &str) -> Option<String> {
    let t = line.trim_start();
    for c in ['`', '~'] {
        let n = t.chars().take_while(|&x| x == c).count();
        if n >= 3 {
            return Some(std::iter::repeat_n(c, n).collect());
        }
    }
    None
}

/// The code-block languages whose lines are read as shell command lines.
fn is_shell(lang: &str) -> bool {
    matches!(
        lang,
        "" | "sh" | "bash" | "shell" | "console" | "sh-session"
    )
}

fn check_markdown(
    repo: &Repo,
    path: &Path,
    text: &str,
    anchors: &mut HashMap<PathBuf, BTreeSet<String>>,
    commands: &mut Commands<'_, '_>,
    findings: &mut Vec<Finding>,
    checked: &mut Checked,
) {
    let file = repo.relative(path);
    let dir = path.parent().unwrap_or(&repo.root).to_path_buf();
    let mut fence: Option<(String, String)> = None;
    // A shell line continued with `\`, and the line it began on.
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if let Some(open) = fence_marker(line) {
            match &fence {
                Some((f, _)) if open.starts_with(f.as_str()) && line.trim() == open => {
                    fence = None;
                    pending = None;
                }
                Some(_) => {}
                None => {
                    let lang = line.trim_start()[open.len()..].trim().to_string();
                    fence = Some((open, lang));
                }
            }
            continue;
        }
        if let Some((_, lang)) = &fence {
            if !is_shell(lang) {
                continue;
            }
            let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
            if let Some(head) = line.strip_suffix('\\') {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
                continue;
            }
            joined.push_str(line);
            for finding in commands.check_line(&joined) {
                checked.commands += 1;
                if let Err(message) = finding {
                    findings.push(Finding {
                        file: file.clone(),
                        line: start,
                        message,
                    });
                }
            }
            continue;
        }
        if line.contains(concat!("..", "/shared")) {
            findings.push(Finding {
                file: file.clone(),
                line: n,
                message: "cites a document outside the repository".into(),
            });
        }
        let (prose, spans) = split_code_spans(line);
        for message in commands.check_named(&prose_and_spans(&prose, &spans)) {
            findings.push(Finding {
                file: file.clone(),
                line: n,
                message,
            });
        }
        for span in spans {
            if let Some(candidate) = path_candidate(repo, span) {
                checked.paths += 1;
                if !path_exists(repo, &dir, None, &candidate) {
                    findings.push(Finding {
                        file: file.clone(),
                        line: n,
                        message: format!("`{span}`: no such file or directory in the repository"),
                    });
                }
            }
        }
        for target in link_targets(&prose) {
            checked.links += 1;
            if let Err(message) = check_link(repo, &dir, path, &target, anchors) {
                findings.push(Finding {
                    file: file.clone(),
                    line: n,
                    message,
                });
            }
        }
    }
}

/// A line's prose with its code spans, each span marked at its start (`\u{1}`) so that a
/// command is looked for only where a span begins.
fn prose_and_spans(prose: &str, spans: &[&str]) -> String {
    let mut text = prose.to_string();
    for span in spans {
        text.push_str(" \u{1}");
        text.push_str(span);
    }
    text
}

/// A line's text outside its code spans (each span replaced by a space), and the spans.
fn split_code_spans(line: &str) -> (String, Vec<&str>) {
    let mut prose = String::new();
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let ticks = rest[open..].chars().take_while(|&c| c == '`').count();
        let delim = &rest[open..open + ticks];
        let after = &rest[open + ticks..];
        let Some(close) = after.find(delim) else {
            break;
        };
        prose.push_str(&rest[..open]);
        prose.push(' ');
        spans.push(after[..close].trim());
        rest = &after[close + ticks..];
    }
    prose.push_str(rest);
    (prose, spans)
}

/// The targets of a line's inline links and images, `[text](target)`, and of a reference
/// definition, `[label]: target`.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = prose.trim_start();
    if trimmed.starts_with('[') {
        if let Some((_, target)) = trimmed.split_once("]: ") {
            targets.push(target.split_whitespace().next().unwrap_or("").to_string());
            return targets;
        }
    }
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    targets
}

fn check_link(
    repo: &Repo,
    dir: &Path,
    from: &Path,
    target: &str,
    anchors: &mut HashMap<PathBuf, BTreeSet<String>>,
) -> Result<(), String> {
    if target.is_empty() {
        return Err("a link with no target".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (file_part, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let linked = if file_part.is_empty() {
        from.to_path_buf()
    } else {
        let p = if let Some(abs) = file_part.strip_prefix('/') {
            repo.root.join(abs)
        } else {
            dir.join(file_part)
        };
        if !p.exists() {
            return Err(format!("link to {target}: {file_part} does not exist"));
        }
        if !normalize(&p).starts_with(&repo.root) {
            return Err(format!("link to {target}: outside the repository"));
        }
        p
    };
    let Some(anchor) = anchor else {
        return Ok(());
    };
    if linked.extension().is_none_or(|e| e != "md") {
        return Ok(());
    }
    let known = anchors.entry(normalize(&linked)).or_insert_with(|| {
        std::fs::read_to_string(&linked)
            .map(|t| heading_anchors(&t))
            .unwrap_or_default()
    });
    // The caller keyed the docs by their path as walked; look that up too.
    let known = if known.is_empty() {
        anchors.get(&linked).cloned().unwrap_or_default()
    } else {
        known.clone()
    };
    if known.contains(&anchor.to_lowercase()) {
        Ok(())
    } else {
        Err(format!(
            "link to {target}: {} has no heading #{anchor}",
            if file_part.is_empty() {
                "this file".to_string()
            } else {
                file_part.to_string()
            }
        ))
    }
}

/// `.`/`..` resolved without the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Whether a token names something that may be a placeholder rather than a real path.
fn is_example(token: &str) -> bool {
    token.contains(['<', '>', '*', '{', '}', '$', '…', '|', '?', '[', ']', '='])
        || token.contains("...")
        || token.contains("://")
}

/// The repository path a backticked span names, if it names one: a path under a
/// top-level entry of the repository (`docs/<name>.md`, `tests/tests/dns.rs:28`, `deploy/`),
/// a top-level file (`Cargo.toml`), or any `*.md` file. A `:line` suffix, an `#anchor`
/// and a Rust item path (`::name`) after the file are left off.
fn path_candidate(repo: &Repo, span: &str) -> Option<String> {
    if span.is_empty() || span.contains(char::is_whitespace) || is_example(span) {
        return None;
    }
    let mut token = span;
    if let Some(at) = token.find("::") {
        token = &token[..at];
    }
    if let Some(at) = token.find('#') {
        token = &token[..at];
    }
    if let Some((head, tail)) = token.rsplit_once(':') {
        if tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
            token = head;
        }
    }
    let token = token.trim_start_matches("./");
    if token.starts_with('/') || token.starts_with('-') || token.is_empty() {
        return None;
    }
    let first = token.split('/').next().unwrap_or("");
    let under_top = token.contains('/') && repo.top_level.contains(first);
    let top_file = !token.contains('/') && repo.top_level.contains(token) && token.contains('.');
    let markdown = token.ends_with(".md");
    (under_top || top_file || markdown || has_source_extension(token) || token.starts_with("../"))
        .then(|| token.to_string())
}

/// The extensions of the repository's own kinds of file: a name with one of them
/// (`crash_loop.rs`, `engine/node.rs`, `empty.golden`) names a file of the repository.
const SOURCE_EXTENSIONS: [&str; 7] = ["rs", "md", "toml", "yaml", "sh", "svg", "golden"];

fn has_source_extension(token: &str) -> bool {
    let name = token.rsplit('/').next().unwrap_or(token);
    name.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && SOURCE_EXTENSIONS.contains(&ext))
}

/// Whether `token` exists: from the root, from `dir` (the citing file's), from a workspace
/// member's directory (cargo names a test file relative to its package), or — a bare
/// `*.md` name — anywhere in the repository.
fn path_exists(repo: &Repo, dir: &Path, crate_dir: Option<&Path>, token: &str) -> bool {
    let token = token.trim_end_matches('/');
    let mut bases = vec![repo.root.clone(), dir.to_path_buf()];
    bases.extend(crate_dir.map(Path::to_path_buf));
    if !token.starts_with("../") {
        bases.extend(repo.members.iter().cloned());
    }
    if bases.iter().any(|b| {
        let p = normalize(&b.join(token));
        p.starts_with(&repo.root) && p.exists()
    }) {
        return true;
    }
    if !token.contains('/') && repo.file_names.contains(token) {
        return token.ends_with(".md") || has_source_extension(token);
    }
    // A path relative to a crate's source (`engine/node.rs`, `daemon/requests.rs`).
    has_source_extension(token)
        && !token.starts_with("../")
        && repo.files.iter().any(|f| f.ends_with(&format!("/{token}")))
}

// ---------------------------------------------------------------------------------------
// Command lines

struct Commands<'a, 'b> {
    redirector: &'a mut ParseCheck<'b>,
    xtask: &'a mut ParseCheck<'b>,
    /// Results by the words checked: the same line is checked once.
    seen: BTreeMap<(bool, Vec<String>), Result<(), String>>,
}

impl Commands<'_, '_> {
    /// The commands a text names in passing — `cargo xtask NAME` and, in a code span,
    /// `redirector NAME` — whose subcommand does not exist (the flags of a command named in
    /// prose are not checked: prose writes `[--json]` and `PATH`).
    fn check_named(&mut self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut named = |is_xtask: bool, rest: &str| {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            if word.is_empty() || word.starts_with('-') {
                return;
            }
            let args = vec![word.clone(), "--help".to_string()];
            let key = (is_xtask, args.clone());
            let result = match self.seen.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = if is_xtask {
                        (self.xtask)(&args)
                    } else {
                        (self.redirector)(&args)
                    };
                    self.seen.insert(key, r.clone());
                    r
                }
            };
            if let Err(e) = result {
                let name = if is_xtask {
                    "cargo xtask"
                } else {
                    "redirector"
                };
                out.push(format!("names `{name} {word}`, which does not exist: {e}"));
            }
        };
        for (at, _) in text.match_indices("cargo xtask ") {
            named(true, &text[at + "cargo xtask ".len()..]);
        }
        for (at, _) in text.match_indices("\u{1}redirector ") {
            named(false, &text[at + "\u{1}redirector ".len()..]);
        }
        out
    }

    /// The results of the `redirector …` and `cargo xtask …` commands of a shell line.
    fn check_line(&mut self, line: &str) -> Vec<Result<(), String>> {
        let line = line.trim();
        let line = line.strip_prefix("$ ").unwrap_or(line);
        let mut out = Vec::new();
        for words in simple_commands(line) {
            let Some((is_xtask, args)) = program_args(&words) else {
                continue;
            };
            let key = (is_xtask, args.clone());
            let result = match self.seen.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = if is_xtask {
                        (self.xtask)(&args)
                    } else {
                        (self.redirector)(&args)
                    };
                    let name = if is_xtask {
                        "cargo xtask"
                    } else {
                        "redirector"
                    };
                    let r = r.map_err(|e| format!("`{name} {}`: {e}", args.join(" ")));
                    self.seen.insert(key, r.clone());
                    r
                }
            };
            out.push(result);
        }
        out
    }
}

/// The program a simple command runs, if it is `redirector` (or the binary under its
/// drop-in name, `istio-iptables`) or `cargo xtask`: the wrappers before it (variable
/// assignments, `sudo`, `env`, `flock FILE`, `timeout N`, `ip netns exec NAME`, anything
/// before a `--` that a `redirector` follows) are passed over.
fn program_args(words: &[String]) -> Option<(bool, Vec<String>)> {
    let mut i = 0;
    loop {
        let w = words.get(i)?.as_str();
        let assignment = w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with('-')
        });
        if assignment || matches!(w, "sudo" | "env" | "exec" | "nohup") {
            i += 1;
        } else if matches!(w, "flock" | "timeout") {
            i += 2;
        } else if w == "ip" && words.get(i + 1).is_some_and(|x| x == "netns") {
            i += 4;
        } else {
            break;
        }
    }
    let program = |w: &str| {
        Path::new(w)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    };
    let first = words.get(i)?;
    match program(first).as_deref() {
        Some("redirector") => return Some((false, words[i + 1..].to_vec())),
        Some("istio-iptables") => return Some((false, words[i..].to_vec())),
        Some("cargo") if words.get(i + 1).is_some_and(|w| w == "xtask") => {
            return Some((true, words[i + 2..].to_vec()))
        }
        _ => {}
    }
    // `kubectl exec POD -- redirector status`, `nsenter … -- redirector …`.
    let dashes = words.iter().position(|w| w == "--")?;
    let next = words.get(dashes + 1)?;
    (program(next).as_deref() == Some("redirector")).then(|| (false, words[dashes + 2..].to_vec()))
}

/// A shell line's simple commands, each as its words (quotes removed): split at `;`,
/// `&&`, `||`, `|`, `&`, parentheses; redirections and their targets dropped; a `#` word
/// starts a comment.
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut skip_next_word = false;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    let finish_word =
        |word: &mut String, in_word: &mut bool, words: &mut Vec<String>, skip: &mut bool| {
            if *in_word {
                if *skip {
                    *skip = false;
                } else {
                    words.push(std::mem::take(word));
                }
                word.clear();
                *in_word = false;
            }
        };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' => {
                in_word = true;
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    word.push(chars[i]);
                    i += 1;
                }
            }
            '"' => {
                in_word = true;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    word.push(chars[i]);
                    i += 1;
                }
            }
            '\\' if i + 1 < chars.len() => {
                in_word = true;
                word.push(chars[i + 1]);
                i += 1;
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                in_word = true;
                let mut depth = 0;
                while i < chars.len() {
                    word.push(chars[i]);
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                finish_word(&mut word, &mut in_word, &mut words, &mut skip_next_word)
            }
            ';' | '&' | '|' | '(' | ')' => {
                finish_word(&mut word, &mut in_word, &mut words, &mut skip_next_word);
                if !words.is_empty() {
                    commands.push(std::mem::take(&mut words));
                }
                // `&>` and `>&` are redirections.
                if c == '&' && chars.get(i + 1) == Some(&'>') {
                    skip_next_word = true;
                    i += 1;
                }
            }
            '>' | '<' => {
                // `2>file`, `>file`, `> file`, `2>&1`: the descriptor number is no word.
                if in_word && word.chars().all(|d| d.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                } else {
                    finish_word(&mut word, &mut in_word, &mut words, &mut skip_next_word);
                }
                while matches!(chars.get(i + 1), Some('>' | '<' | '&')) {
                    i += 1;
                }
                skip_next_word = true;
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
        i += 1;
    }
    finish_word(&mut word, &mut in_word, &mut words, &mut skip_next_word);
    if !words.is_empty() {
        commands.push(words);
    }
    commands
}

/// Checks `redirector` command lines with the binary at `bin`: the words with `--help`
/// after them (before a `--`); after `pod add … --`, the flags with `--help` through the
/// drop-in of the `--dialect` given. Exit 0 with a usage text: they parse.
pub(crate) fn binary_check(bin: &Path) -> impl FnMut(&[String]) -> Result<(), String> + '_ {
    move |args: &[String]| {
        let (before, after) = match args.iter().position(|a| a == "--") {
            Some(at) => (&args[..at], Some(&args[at + 1..])),
            None => (args, None),
        };
        run_help(bin, before)?;
        let words: Vec<&str> = before.iter().map(String::as_str).collect();
        if let (["pod", "add", ..], Some(flags)) = (words.as_slice(), after) {
            let dialect = words
                .windows(2)
                .find(|w| w[0] == "--dialect")
                .map(|w| w[1])
                .or_else(|| words.iter().find_map(|w| w.strip_prefix("--dialect=")))
                .unwrap_or("istio");
            let drop_in = if dialect == "linkerd" {
                "linkerd-proxy-init"
            } else {
                "istio-iptables"
            };
            let mut argv = vec![drop_in.to_string()];
            argv.extend(flags.iter().cloned());
            run_help(bin, &argv).map_err(|e| format!("the flags after `--`: {e}"))?;
        }
        Ok(())
    }
}

fn run_help(bin: &Path, args: &[String]) -> Result<(), String> {
    let mut child = Command::new(bin)
        .args(args)
        .arg("--help")
        // Were the help not reached, nothing is set up at the real pin root.
        .env("REDIRECTOR_PIN_ROOT", "/nonexistent/redirector-docs-check")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("did not exit with its help: the arguments were run".into());
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("Usage") {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reason = stderr
        .lines()
        .chain(stdout.lines())
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_string();
    Err(format!("does not parse ({}): {reason}", out.status))
}

// ---------------------------------------------------------------------------------------
// Rust comments

/// The comments of a Rust source, each as (line, text): line and block comments, doc
/// comments included; strings, raw strings and character literals are passed over.
fn rust_comments(src: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '\n' => line += 1,
            '/' if c.get(i + 1) == Some(&'/') => {
                let start = i;
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                out.push((line, c[start..i].iter().collect()));
                continue;
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                let mut text = String::new();
                let first = line;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                        continue;
                    }
                    if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                        continue;
                    }
                    if c[i] == '\n' {
                        out.push((line, std::mem::take(&mut text)));
                        line += 1;
                    } else {
                        text.push(c[i]);
                    }
                    i += 1;
                }
                let _ = first;
                out.push((line, text));
                continue;
            }
            'r' | 'b'
                if !c
                    .get(i.wrapping_sub(1))
                    .is_some_and(|p| p.is_alphanumeric() || *p == '_') =>
            {
                // r"…", r#"…"#, br"…", b"…"
                let mut j = i + 1;
                if c[i] == 'b' && c.get(j) == Some(&'r') {
                    j += 1;
                }
                let raw = c[i] == 'r' || c.get(i + 1) == Some(&'r');
                let mut hashes = 0;
                while raw && c.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if c.get(j) == Some(&'"') && (raw || c[i] == 'b') {
                    if raw {
                        i = j + 1;
                        loop {
                            if i >= c.len() {
                                break;
                            }
                            if c[i] == '\n' {
                                line += 1;
                            }
                            if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
                                i += 1 + hashes;
                                break;
                            }
                            i += 1;
                        }
                        continue;
                    }
                    i = j; // b"…": read as a plain string below
                    continue;
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if c.get(i) == Some(&'\n') {
                        line += 1;
                    }
                    i += 1;
                }
            }
            '\'' => {
                // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
                if c.get(i + 1) == Some(&'\\') {
                    i += 3;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                } else if c.get(i + 2) == Some(&'\'') {
                    i += 2;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn check_comments(
    repo: &Repo,
    path: &Path,
    src: &str,
    commands: &mut Commands<'_, '_>,
    findings: &mut Vec<Finding>,
    checked: &mut Checked,
) {
    let file = repo.relative(path);
    let dir = path.parent().unwrap_or(&repo.root);
    let crate_dir = path
        .ancestors()
        .skip(1)
        .find(|d| d.join("Cargo.toml").is_file() && d.starts_with(&repo.root));
    for (line, text) in rust_comments(src) {
        if text.contains(concat!("..", "/shared")) {
            findings.push(Finding {
                file: file.clone(),
                line,
                message: "cites a document outside the repository".into(),
            });
            continue;
        }
        for message in commands.check_named(&text) {
            findings.push(Finding {
                file: file.clone(),
                line,
                message,
            });
        }
        for raw in text.split(|c: char| c.is_whitespace() || "`()[],;\"'".contains(c)) {
            let token = raw.trim_end_matches(['.', ':', '!', '?']);
            if token.is_empty() || is_example(token) || token.starts_with('/') {
                continue;
            }
            let Some(candidate) = path_candidate(repo, token) else {
                continue;
            };
            // A bare word that is also a top-level name is no citation: a path needs a
            // slash or the Markdown extension.
            if !candidate.contains('/') && !candidate.ends_with(".md") {
                continue;
            }
            checked.citations += 1;
            if !path_exists(repo, dir, crate_dir, &candidate) {
                findings.push(Finding {
                    file: file.clone(),
                    line,
                    message: format!("cites {candidate}, which is not in the repository"),
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The Linkerd manifest

/// The env entry that makes deploy/daemonset-linkerd.yaml Linkerd's.
const LINKERD_DIALECT_LINE: &str = "- {name: REDIRECTOR_CNI_DIALECT, value: linkerd}";

/// deploy/daemonset-linkerd.yaml against deploy/daemonset.yaml: the same lines once
/// comments and blank lines are left out, but for the dialect's env entry.
fn linkerd_manifest(root: &Path) -> Vec<Finding> {
    let read = |name: &str| std::fs::read_to_string(root.join("deploy").join(name)).ok();
    let (Some(istio), Some(linkerd)) = (read("daemonset.yaml"), read("daemonset-linkerd.yaml"))
    else {
        return Vec::new();
    };
    let content = |text: &str| -> Vec<(usize, String)> {
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                let l = match l.find(" #") {
                    Some(at) => &l[..at],
                    None => l,
                };
                (i + 1, l.trim_end().to_string())
            })
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect()
    };
    let istio = content(&istio);
    let mut linkerd = content(&linkerd);
    let Some(at) = linkerd
        .iter()
        .position(|(_, l)| l.trim() == LINKERD_DIALECT_LINE)
    else {
        return vec![Finding {
            file: PathBuf::from("deploy/daemonset-linkerd.yaml"),
            line: 1,
            message: format!("has no `{LINKERD_DIALECT_LINE}`"),
        }];
    };
    linkerd.remove(at);
    for (i, (line, text)) in linkerd.iter().enumerate() {
        if istio.get(i).map(|(_, t)| t) != Some(text) {
            return vec![Finding {
                file: PathBuf::from("deploy/daemonset-linkerd.yaml"),
                line: *line,
                message: format!(
                    "differs from deploy/daemonset.yaml (line {}): `{}`",
                    istio.get(i).map_or(0, |(l, _)| *l),
                    text.trim()
                ),
            }];
        }
    }
    if istio.len() != linkerd.len() {
        return vec![Finding {
            file: PathBuf::from("deploy/daemonset-linkerd.yaml"),
            line: linkerd.last().map_or(1, |(l, _)| *l),
            message: "ends before deploy/daemonset.yaml does".into(),
        }];
    }
    Vec::new()
}

// ---------------------------------------------------------------------------------------
// The command

/// `cargo xtask docs`, and the first step of `cargo xtask test`: every check, with the
/// redirector binary at `bin`; an error lists every finding.
pub(crate) fn run(bin: &Path) -> anyhow::Result<()> {
    let root = crate::workspace::workspace_root();
    let mut redirector = binary_check(bin);
    let mut xtask = crate::xtask_parses;
    let (findings, checked) = check(&root, &mut redirector, &mut xtask);
    for f in &findings {
        println!("docs: {f}");
    }
    println!(
        "docs: {} Markdown files ({} links, {} paths, {} command lines), {} Rust files ({} citations): {} findings",
        checked.markdown_files,
        checked.links,
        checked.paths,
        checked.commands,
        checked.rust_files,
        checked.citations,
        findings.len()
    );
    if !findings.is_empty() {
        anyhow::bail!("the docs check found {} problems", findings.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository with a README, a doc, a crate with a comment, and the files they name.
    struct Fixture {
        dir: PathBuf,
    }

    impl Fixture {
        fn new(name: &str) -> Fixture {
            let dir = std::env::temp_dir()
                .join(format!("xtask-docs-check-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let f = Fixture { dir };
            f.write("Cargo.toml", "[workspace]\n");
            f.write(
                "README.md",
                "# Tool\n\nSee [the guide](docs/guide.md#running-it) and `docs/guide.md`.\n\n\
                 ```sh\nredirector status --json\ncargo xtask bench --quick\n```\n",
            );
            f.write(
                "docs/guide.md",
                "# Guide\n\n## Running it\n\nBack to [the README](../README.md).\n",
            );
            f.write("core/Cargo.toml", "[package]\n");
            f.write(
                "core/src/lib.rs",
                "//! The rules are in docs/guide.md (`README.md`).\nfn f() {}\n",
            );
            f
        }

        fn write(&self, path: &str, text: &str) {
            let p = self.dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }

        fn edit(&self, path: &str, from: &str, to: &str) {
            let p = self.dir.join(path);
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.contains(from), "{path} lacks {from:?}");
            std::fs::write(p, text.replace(from, to)).unwrap();
        }

        /// The findings, with `redirector` checked against a small clap definition that
        /// has `status --json` and `status --netns PATH`.
        fn findings(&self) -> Vec<String> {
            let mut redirector = |args: &[String]| {
                let cmd = clap::Command::new("redirector").subcommand(
                    clap::Command::new("status")
                        .arg(
                            clap::Arg::new("json")
                                .long("json")
                                .action(clap::ArgAction::SetTrue),
                        )
                        .arg(clap::Arg::new("netns").long("netns")),
                );
                let argv = std::iter::once("redirector".to_string()).chain(args.iter().cloned());
                cmd.try_get_matches_from(argv)
                    .map(drop)
                    .map_err(|e| e.to_string())
            };
            let mut xtask = crate::xtask_parses;
            let (findings, _) = check(&self.dir, &mut redirector, &mut xtask);
            findings.iter().map(ToString::to_string).collect()
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn a_consistent_repository_passes() {
        assert_eq!(Fixture::new("clean").findings(), Vec::<String>::new());
    }

    #[test]
    fn a_broken_link_fails() {
        let f = Fixture::new("link");
        f.edit("README.md", "(docs/guide.md#", "(docs/gide.md#");
        let found = f.findings();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("README.md:3: link to docs/gide.md#running-it"),
            "{found:?}"
        );
    }

    #[test]
    fn a_missing_anchor_fails() {
        let f = Fixture::new("anchor");
        f.edit("docs/guide.md", "## Running it", "## Run it");
        let found = f.findings();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("has no heading #running-it"), "{found:?}");
    }

    #[test]
    fn a_missing_path_fails_and_an_example_does_not() {
        let f = Fixture::new("path");
        f.edit(
            "README.md",
            "`docs/guide.md`",
            "`docs/howto.md:12` and `docs/<name>.md`",
        );
        let found = f.findings();
        assert_eq!(
            found,
            ["README.md:3: `docs/howto.md:12`: no such file or directory in the repository"]
        );
    }

    #[test]
    fn a_source_file_named_relative_to_its_crate_must_exist() {
        let f = Fixture::new("suffix");
        f.edit(
            "docs/guide.md",
            "Back to",
            "See `src/lib.rs` and `src/main.rs`. Back to",
        );
        assert_eq!(
            f.findings(),
            ["docs/guide.md:5: `src/main.rs`: no such file or directory in the repository"]
        );
    }

    #[test]
    fn an_unknown_flag_fails() {
        let f = Fixture::new("flag");
        f.edit("README.md", "status --json", "status --jsn");
        let found = f.findings();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("README.md:6: `redirector status --jsn`:"),
            "{found:?}"
        );
    }

    #[test]
    fn an_unknown_xtask_flag_or_command_fails() {
        let f = Fixture::new("xtask");
        f.edit(
            "README.md",
            "bench --quick",
            "bench --fast\ncargo xtask fuzz",
        );
        let found = f.findings();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("README.md:7: `cargo xtask bench --fast`:"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("README.md:8: `cargo xtask fuzz`:"),
            "{found:?}"
        );
    }

    #[test]
    fn a_missing_cited_file_fails() {
        let f = Fixture::new("cited");
        f.edit(
            "core/src/lib.rs",
            "(`README.md`)",
            "(`CONTRACT.md`, docs/old.md)",
        );
        let found = f.findings();
        assert_eq!(
            found,
            [
                "core/src/lib.rs:1: cites CONTRACT.md, which is not in the repository",
                "core/src/lib.rs:1: cites docs/old.md, which is not in the repository",
            ]
        );
    }

    #[test]
    fn a_command_named_in_passing_must_exist() {
        let f = Fixture::new("named");
        f.edit(
            "core/src/lib.rs",
            "fn f() {}",
            "// Longer runs: `cargo xtask fuzz`.\nfn f() {}",
        );
        f.edit(
            "docs/guide.md",
            "Back to",
            "Run `cargo xtask bench --quick` or `redirector stats`. Back to",
        );
        let found = f.findings();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("docs/guide.md:5: names `redirector stats`, which does not exist"),
            "{found:?}"
        );
        assert!(
            found[1]
                .starts_with("core/src/lib.rs:2: names `cargo xtask fuzz`, which does not exist"),
            "{found:?}"
        );
    }

    #[test]
    fn a_document_outside_the_repository_fails() {
        let f = Fixture::new("outside");
        let outside = concat!("..", "/shared/NOTES.md");
        f.edit(
            "core/src/lib.rs",
            "fn f() {}",
            &format!("// See {outside}.\nfn f() {{}}"),
        );
        f.edit(
            "docs/guide.md",
            "Back to",
            &format!("From {outside}. Back to"),
        );
        let found = f.findings();
        assert_eq!(
            found,
            [
                "docs/guide.md:5: cites a document outside the repository",
                "core/src/lib.rs:2: cites a document outside the repository",
            ]
        );
    }

    #[test]
    fn the_linkerd_manifest_follows_the_istio_one() {
        let f = Fixture::new("manifest");
        let istio = "kind: DaemonSet # the node\nspec:\n  env:\n    - {name: A, value: b}\n";
        f.write("deploy/daemonset.yaml", istio);
        f.write(
            "deploy/daemonset-linkerd.yaml",
            &format!("# Linkerd's\n{istio}    {LINKERD_DIALECT_LINE}\n"),
        );
        assert_eq!(f.findings(), Vec::<String>::new());
        f.edit("deploy/daemonset.yaml", "value: b", "value: c");
        assert_eq!(
            f.findings(),
            [
                "deploy/daemonset-linkerd.yaml:5: differs from deploy/daemonset.yaml (line 4): \
              `- {name: A, value: b}`"
            ]
        );
    }

    #[test]
    fn strings_are_not_comments() {
        let src = "let a = \"// docs/none.md\"; let b = r#\"x \" // y.md\"#; let c = '\"';\n\
                   // real docs/one.md\nfn f<'a>(x: &'a str) {} /* block\n two.md */";
        let comments = rust_comments(src);
        let texts: Vec<_> = comments
            .iter()
            .map(|(l, t)| (*l, t.trim().to_string()))
            .collect();
        assert_eq!(
            texts,
            [
                (2, "// real docs/one.md".to_string()),
                (3, "block".to_string()),
                (4, "two.md".to_string())
            ]
        );
    }

    #[test]
    fn shell_lines_split_into_commands() {
        assert_eq!(
            simple_commands(
                "A=1 redirector daemon --x 'a b' & redirector pod list 2>/dev/null | jq . # note"
            ),
            [
                vec!["A=1", "redirector", "daemon", "--x", "a b"],
                vec!["redirector", "pod", "list"],
                vec!["jq", "."],
            ]
        );
        let words: Vec<String> = ["kubectl", "exec", "p", "--", "redirector", "status"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            program_args(&words),
            Some((false, vec!["status".to_string()]))
        );
        let words: Vec<String> = ["kubectl", "-n", "redirector", "get", "pods"]
            .map(String::from)
            .to_vec();
        assert_eq!(program_args(&words), None);
    }

    #[test]
    fn anchors_follow_github() {
        let a = heading_anchors(
            "# The operator's day\n## `explain` and status\n## A\n## A\n```\n# not\n```\n",
        );
        assert_eq!(
            a.into_iter().collect::<Vec<_>>(),
            ["a", "a-1", "explain-and-status", "the-operators-day"]
        );
    }
}

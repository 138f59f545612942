//! A Dockerfile parser: the instructions `lockbox image build` runs (see docs/images.md,
//! "Building").
//!
//! Parsing is two steps, as in Docker. [`parse`] splits the file into logical lines (line
//! continuations joined, comments and parser directives dropped), recognises each keyword and
//! groups the instructions into stages; an unknown or unsupported instruction is an error
//! naming its line. [`Instruction::resolve`] then turns one instruction into a [`Step`], with
//! `$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:+alternative}` substituted from the build's
//! variables at that point (ARG and ENV values), quotes removed and words split. `parse`
//! resolves every instruction once with every variable `1`, so a malformed one (a `COPY` with no
//! destination, an `EXPOSE` of a non-port) is also reported at parse time, with its line.
//!
//! As in Docker, `RUN`, `CMD`, `ENTRYPOINT` and `SHELL` are not substituted: their shell (or
//! the program) sees the variables in its environment.

use std::fmt;

/// A Dockerfile that cannot be parsed or an instruction that cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {reason}")]
pub struct DockerfileError {
    /// The (first) line of the instruction, counted from 1.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

fn err<T>(line: usize, reason: impl Into<String>) -> Result<T, DockerfileError> {
    Err(DockerfileError {
        line,
        reason: reason.into(),
    })
}

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The `ARG`s before the first `FROM` (they may be used in `FROM` lines, and re-declared
    /// without a value inside a stage to be used there).
    pub global_args: Vec<Instruction>,
    /// The stages, in order; the last one is the image built.
    pub stages: Vec<Stage>,
}

/// One stage: a `FROM` and the instructions after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The `FROM` instruction.
    pub from: Instruction,
    /// The stage's name (`FROM image AS name`), lower-cased as Docker does.
    pub name: Option<String>,
    /// The instructions after `FROM`.
    pub instructions: Vec<Instruction>,
}

/// An instruction keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyword {
    /// `FROM`
    From,
    /// `RUN`
    Run,
    /// `COPY`
    Copy,
    /// `ADD`
    Add,
    /// `ENV`
    Env,
    /// `ARG`
    Arg,
    /// `WORKDIR`
    Workdir,
    /// `USER`
    User,
    /// `LABEL`
    Label,
    /// `MAINTAINER` (deprecated in Docker; a `maintainer` label)
    Maintainer,
    /// `EXPOSE`
    Expose,
    /// `ENTRYPOINT`
    Entrypoint,
    /// `CMD`
    Cmd,
    /// `SHELL`
    Shell,
    /// `STOPSIGNAL`
    StopSignal,
}

impl Keyword {
    fn parse(word: &str) -> Option<Keyword> {
        Some(match word.to_ascii_uppercase().as_str() {
            "FROM" => Keyword::From,
            "RUN" => Keyword::Run,
            "COPY" => Keyword::Copy,
            "ADD" => Keyword::Add,
            "ENV" => Keyword::Env,
            "ARG" => Keyword::Arg,
            "WORKDIR" => Keyword::Workdir,
            "USER" => Keyword::User,
            "LABEL" => Keyword::Label,
            "MAINTAINER" => Keyword::Maintainer,
            "EXPOSE" => Keyword::Expose,
            "ENTRYPOINT" => Keyword::Entrypoint,
            "CMD" => Keyword::Cmd,
            "SHELL" => Keyword::Shell,
            "STOPSIGNAL" => Keyword::StopSignal,
            _ => return None,
        })
    }

    /// The keyword as written in a Dockerfile (upper case).
    pub fn as_str(self) -> &'static str {
        match self {
            Keyword::From => "FROM",
            Keyword::Run => "RUN",
            Keyword::Copy => "COPY",
            Keyword::Add => "ADD",
            Keyword::Env => "ENV",
            Keyword::Arg => "ARG",
            Keyword::Workdir => "WORKDIR",
            Keyword::User => "USER",
            Keyword::Label => "LABEL",
            Keyword::Maintainer => "MAINTAINER",
            Keyword::Expose => "EXPOSE",
            Keyword::Entrypoint => "ENTRYPOINT",
            Keyword::Cmd => "CMD",
            Keyword::Shell => "SHELL",
            Keyword::StopSignal => "STOPSIGNAL",
        }
    }
}

impl fmt::Display for Keyword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Docker instructions `lockbox image build` does not support, and why.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "VOLUME",
        "lockbox images have no volumes; mount host directories with `lockbox run --mount`",
    ),
    (
        "HEALTHCHECK",
        "lockbox does not run health checks; remove the instruction",
    ),
    (
        "ONBUILD",
        "ONBUILD triggers are not supported; put the instructions in the child Dockerfile",
    ),
];

/// One instruction, as written (continuations joined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// The line it starts on, counted from 1.
    pub line: usize,
    /// Its keyword.
    pub keyword: Keyword,
    /// Everything after the keyword, trimmed; continuation lines joined without their escape
    /// character and newline.
    pub args: String,
    /// The escape character in force (`\`, or `` ` `` after `# escape=``).
    pub escape: char,
}

impl fmt::Display for Instruction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.keyword, self.args)
    }
}

/// A command of `RUN`, `CMD` or `ENTRYPOINT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Shell form: run with the stage's `SHELL` (default `/bin/sh -c`).
    Shell(String),
    /// Exec form (a JSON array): run as it is.
    Exec(Vec<String>),
}

impl Command {
    /// The argv to run: exec form as it is, shell form after `shell`.
    pub fn argv(&self, shell: &[String]) -> Vec<String> {
        match self {
            Command::Exec(v) => v.clone(),
            Command::Shell(s) => {
                let mut v = shell.to_vec();
                v.push(s.clone());
                v
            }
        }
    }
}

/// A `COPY` or `ADD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// `ADD` (a local tar archive source is extracted) rather than `COPY`.
    pub add: bool,
    /// `--from=STAGE|IMAGE`: copy from an earlier stage (or an image) instead of the context.
    pub from: Option<String>,
    /// `--chown=` as given. Not applied: files in a lockbox image are presented as owned by
    /// root (the sandbox's user namespace maps only the caller).
    pub chown: Option<String>,
    /// `--chmod=` as given (octal).
    pub chmod: Option<u32>,
    /// The sources, relative to the context (or the stage's root).
    pub sources: Vec<String>,
    /// The destination (relative ones are under the working directory).
    pub dest: String,
}

/// One resolved instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `FROM [--platform=P] BASE [AS NAME]`.
    From {
        /// The image reference or an earlier stage's name.
        base: String,
        /// The stage's name.
        name: Option<String>,
        /// `--platform`.
        platform: Option<String>,
    },
    /// `RUN`.
    Run(Command),
    /// `COPY` / `ADD`.
    Copy(CopySpec),
    /// `ENV K=V ...` (or the legacy `ENV K V`).
    Env(Vec<(String, String)>),
    /// `ARG NAME[=DEFAULT] ...`.
    Arg(Vec<(String, Option<String>)>),
    /// `WORKDIR`.
    Workdir(String),
    /// `USER user[:group]`.
    User(String),
    /// `LABEL K=V ...` (and `MAINTAINER`, as a `maintainer` label).
    Label(Vec<(String, String)>),
    /// `EXPOSE`, normalised to `PORT/PROTO` (`80/tcp`).
    Expose(Vec<String>),
    /// `ENTRYPOINT`.
    Entrypoint(Command),
    /// `CMD`.
    Cmd(Command),
    /// `SHELL [...]`.
    Shell(Vec<String>),
    /// `STOPSIGNAL`.
    StopSignal(String),
}

/// Parses a Dockerfile. Every instruction is also resolved once (every variable `1`), so a
/// malformed one is reported here with its line.
pub fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut escape = '\\';
    let mut i = 0;
    // Parser directives: `# name=value` lines at the very top (before any other line).
    while i < lines.len() {
        let Some(rest) = lines[i].trim_start().strip_prefix('#') else {
            break;
        };
        let Some((name, value)) = rest.split_once('=') else {
            break;
        };
        let name = name.trim().to_ascii_lowercase();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            break;
        }
        if name == "escape" {
            match value.trim() {
                "\\" => escape = '\\',
                "`" => escape = '`',
                other => {
                    return err(
                        i + 1,
                        format!("escape directive {other:?}: only \\ and ` are allowed"),
                    )
                }
            }
        }
        // `syntax` (a BuildKit frontend) and unknown directives are ignored.
        i += 1;
    }

    let mut global_args = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    while i < lines.len() {
        let start = i;
        let first = lines[i];
        i += 1;
        let trimmed = first.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        // Join continuation lines; comment and empty lines inside are dropped (as Docker).
        let mut logical = String::new();
        let mut cur = first.trim_end();
        loop {
            // As Docker: a line whose last non-blank character is the escape continues.
            match cur.strip_suffix(escape) {
                Some(head) => logical.push_str(head),
                None => {
                    logical.push_str(cur);
                    break;
                }
            }
            // Find the next line that is not a comment or empty.
            let mut next = None;
            while i < lines.len() {
                let l = lines[i];
                i += 1;
                let t = l.trim();
                if t.is_empty() || t.starts_with('#') {
                    continue;
                }
                next = Some(l.trim_end());
                break;
            }
            match next {
                Some(l) => cur = l,
                None => break,
            }
        }
        let logical = logical.trim();
        let line = start + 1;
        let (word, args) = match logical.find(char::is_whitespace) {
            Some(p) => (&logical[..p], logical[p..].trim()),
            None => (logical, ""),
        };
        let Some(keyword) = Keyword::parse(word) else {
            let upper = word.to_ascii_uppercase();
            if let Some((_, why)) = UNSUPPORTED.iter().find(|(k, _)| *k == upper) {
                return err(
                    line,
                    format!("{upper} is not supported by lockbox image build: {why}"),
                );
            }
            return err(line, format!("unknown instruction {word:?}"));
        };
        if args.is_empty() {
            return err(line, format!("{keyword} needs arguments"));
        }
        let ins = Instruction {
            line,
            keyword,
            args: args.to_owned(),
            escape,
        };
        // Validate with every variable set to `1` (a value every field takes: the real
        // values are known only while building).
        let step = ins.resolve(&|_| Some("1".to_owned()))?;
        match (keyword, step) {
            (Keyword::From, Step::From { name, .. }) => {
                if let Some(n) = &name {
                    if stages.iter().any(|s| s.name.as_deref() == Some(n)) {
                        return err(line, format!("stage name {n:?} is used twice"));
                    }
                }
                stages.push(Stage {
                    from: ins,
                    name,
                    instructions: Vec::new(),
                });
            }
            (Keyword::Arg, _) if stages.is_empty() => global_args.push(ins),
            (_, _) => match stages.last_mut() {
                Some(s) => s.instructions.push(ins),
                None => {
                    return err(
                        line,
                        format!("{keyword} before the first FROM (only ARG may come before it)"),
                    )
                }
            },
        }
    }
    if stages.is_empty() {
        return err(lines.len().max(1), "no FROM instruction");
    }
    Ok(Dockerfile {
        global_args,
        stages,
    })
}

impl Instruction {
    /// Resolves the instruction with `vars` (the ARG and ENV values in force).
    pub fn resolve(&self, vars: &dyn Fn(&str) -> Option<String>) -> Result<Step, DockerfileError> {
        let line = self.line;
        let esc = self.escape;
        let words = |text: &str| words(text, esc, vars).map_err(|r| e(line, r));
        let args = self.args.as_str();
        Ok(match self.keyword {
            Keyword::From => {
                let mut w = words(args)?;
                let mut platform = None;
                while let Some(first) = w.first() {
                    let Some(flag) = first.strip_prefix("--") else {
                        break;
                    };
                    match flag.split_once('=') {
                        Some(("platform", p)) if !p.is_empty() => platform = Some(p.to_owned()),
                        _ => return err(line, format!("FROM: unknown flag {first:?}")),
                    }
                    w.remove(0);
                }
                let (base, name) = match w.as_slice() {
                    [base] => (base.clone(), None),
                    [base, as_, name] if as_.eq_ignore_ascii_case("as") => {
                        let name = name.to_ascii_lowercase();
                        let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                            && name
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                        if !ok {
                            return err(line, format!("FROM: stage name {name:?}: must start with a letter and be letters, digits, '.', '_' or '-'"));
                        }
                        (base.clone(), Some(name))
                    }
                    _ => return err(line, "FROM: expected FROM [--platform=P] IMAGE [AS NAME]"),
                };
                if base.is_empty() {
                    // `FROM $UNSET` at parse time: checked again when building.
                    return Ok(Step::From {
                        base,
                        name,
                        platform,
                    });
                }
                Step::From {
                    base,
                    name,
                    platform,
                }
            }
            Keyword::Run => {
                if args.starts_with("--") {
                    let flag = args.split_whitespace().next().unwrap_or(args);
                    return err(
                        line,
                        format!("RUN {flag}: RUN flags (--mount, --network, --security) are not supported; use `lockbox image build --net-allow` for network"),
                    );
                }
                if args.starts_with("<<") {
                    return err(line, "RUN: heredocs are not supported");
                }
                Step::Run(command(args, line, "RUN")?)
            }
            Keyword::Cmd => Step::Cmd(command(args, line, "CMD")?),
            Keyword::Entrypoint => Step::Entrypoint(command(args, line, "ENTRYPOINT")?),
            Keyword::Shell => {
                match exec_form(args) {
                    Some(v) if !v.is_empty() => Step::Shell(v),
                    _ => return err(
                        line,
                        "SHELL: expected a non-empty JSON array, e.g. SHELL [\"/bin/sh\", \"-c\"]",
                    ),
                }
            }
            Keyword::Copy | Keyword::Add => {
                let name = self.keyword.as_str();
                let add = self.keyword == Keyword::Add;
                let (flags_text, rest) = split_flags(args);
                let mut spec = CopySpec {
                    add,
                    from: None,
                    chown: None,
                    chmod: None,
                    sources: Vec::new(),
                    dest: String::new(),
                };
                for flag in words(&flags_text)? {
                    match flag.trim_start_matches("--").split_once('=') {
                        Some(("from", v)) if !v.is_empty() => spec.from = Some(v.to_owned()),
                        Some(("chown", v)) if !v.is_empty() => spec.chown = Some(v.to_owned()),
                        Some(("chmod", v)) if !v.is_empty() => match u32::from_str_radix(v, 8) {
                            Ok(m) if m <= 0o7777 => spec.chmod = Some(m),
                            _ => {
                                return err(
                                    line,
                                    format!("{name} --chmod={v}: expected an octal mode"),
                                )
                            }
                        },
                        _ => {
                            return err(
                                line,
                                format!("{name}: unsupported flag {flag:?} (supported: --from, --chown, --chmod)"),
                            )
                        }
                    }
                }
                if rest.starts_with("<<") {
                    return err(line, format!("{name}: heredocs are not supported"));
                }
                let mut paths = match exec_form(&rest) {
                    Some(v) => v,
                    None => words(&rest)?,
                };
                if paths.len() < 2 {
                    return err(
                        line,
                        format!("{name}: expected at least one source and a destination"),
                    );
                }
                spec.dest = paths.pop().unwrap_or_default();
                spec.sources = paths;
                if add && spec.from.is_none() {
                    if let Some(url) = spec.sources.iter().find(|s| is_url(s)) {
                        return err(
                            line,
                            format!("ADD {url}: adding from a URL is not supported; download it beforehand into the context (or in a RUN step with --net-allow)"),
                        );
                    }
                }
                Step::Copy(spec)
            }
            Keyword::Env | Keyword::Label => {
                let name = self.keyword.as_str();
                let w = words(args)?;
                let pairs = if w.first().is_some_and(|f| !f.contains('=')) {
                    // Legacy `ENV KEY VALUE...`: the value is the rest of the line.
                    let (key, rest) = match args.find(char::is_whitespace) {
                        Some(p) => (&args[..p], args[p..].trim()),
                        None => (args, ""),
                    };
                    if rest.is_empty() {
                        return err(
                            line,
                            format!("{name} {key}: expected KEY=VALUE or KEY VALUE"),
                        );
                    }
                    let value = words(rest)?.join(" ");
                    vec![(words(key)?.concat(), value)]
                } else {
                    let mut pairs = Vec::new();
                    for word in w {
                        match word.split_once('=') {
                            Some((k, v)) if !k.is_empty() => {
                                pairs.push((k.to_owned(), v.to_owned()))
                            }
                            _ => return err(line, format!("{name}: {word:?}: expected KEY=VALUE")),
                        }
                    }
                    pairs
                };
                if self.keyword == Keyword::Env {
                    if let Some((k, _)) = pairs.iter().find(|(k, _)| !valid_var(k)) {
                        return err(line, format!("ENV: {k:?} is not a variable name"));
                    }
                    Step::Env(pairs)
                } else {
                    Step::Label(pairs)
                }
            }
            Keyword::Maintainer => Step::Label(vec![("maintainer".into(), words(args)?.join(" "))]),
            Keyword::Arg => {
                let mut out = Vec::new();
                for word in words(args)? {
                    let (k, v) = match word.split_once('=') {
                        Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                        None => (word, None),
                    };
                    if !valid_var(&k) {
                        return err(line, format!("ARG: {k:?} is not a variable name"));
                    }
                    out.push((k, v));
                }
                Step::Arg(out)
            }
            Keyword::Workdir => {
                let w = words(args)?.join(" ");
                if w.is_empty() {
                    return err(line, "WORKDIR: empty path");
                }
                Step::Workdir(w)
            }
            Keyword::User => match words(args)?.as_slice() {
                [u] if !u.is_empty() => Step::User(u.clone()),
                _ => return err(line, "USER: expected one USER[:GROUP]"),
            },
            Keyword::StopSignal => match words(args)?.as_slice() {
                [s] if !s.is_empty() => Step::StopSignal(s.clone()),
                _ => return err(line, "STOPSIGNAL: expected one signal"),
            },
            Keyword::Expose => {
                let mut ports = Vec::new();
                for word in words(args)? {
                    let (port, proto) = match word.split_once('/') {
                        Some((p, proto)) => (p, proto.to_ascii_lowercase()),
                        None => (word.as_str(), "tcp".to_owned()),
                    };
                    let is_port = |p: &str| p.parse::<u16>().is_ok_and(|n| n > 0);
                    let ok_port = match port.split_once('-') {
                        Some((a, b)) => is_port(a) && is_port(b),
                        None => is_port(port),
                    };
                    if !ok_port || !["tcp", "udp", "sctp"].contains(&proto.as_str()) {
                        return err(
                            line,
                            format!("EXPOSE {word:?}: expected PORT[/tcp|udp|sctp]"),
                        );
                    }
                    ports.push(format!("{port}/{proto}"));
                }
                Step::Expose(ports)
            }
        })
    }
}

fn e(line: usize, reason: String) -> DockerfileError {
    DockerfileError { line, reason }
}

fn is_url(s: &str) -> bool {
    let l = s.to_ascii_lowercase();
    l.starts_with("http://")
        || l.starts_with("https://")
        || l.starts_with("git@")
        || l.starts_with("git://")
}

/// Whether `k` can be a variable name.
fn valid_var(k: &str) -> bool {
    k.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits leading `--flag` words from the rest.
fn split_flags(args: &str) -> (String, String) {
    let mut flags = String::new();
    let mut rest = args.trim_start();
    while rest.starts_with("--") {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        flags.push_str(&rest[..end]);
        flags.push(' ');
        rest = rest[end..].trim_start();
    }
    (flags, rest.to_owned())
}

/// The exec form: a JSON array of strings, else None (shell form).
fn exec_form(args: &str) -> Option<Vec<String>> {
    if !args.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(args).ok()
}

fn command(args: &str, line: usize, name: &str) -> Result<Command, DockerfileError> {
    match exec_form(args) {
        Some(v) if v.is_empty() => err(line, format!("{name}: empty exec form")),
        Some(v) => Ok(Command::Exec(v)),
        None => Ok(Command::Shell(args.to_owned())),
    }
}

/// Splits `text` into words the way Dockerfile instructions do: unquoted whitespace separates
/// words; `"..."` and `'...'` group and are removed; the escape character takes the next
/// character literally (inside double quotes only before `"`, `$` or itself); `$VAR`,
/// `${VAR}`, `${VAR:-word}` and `${VAR:+word}` are replaced (not inside single quotes), and a
/// replacement never splits a word. An unset variable is empty.
pub fn words(
    text: &str,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            if in_word {
                out.push(std::mem::take(&mut cur));
                in_word = false;
            }
            i += 1;
            continue;
        }
        in_word = true;
        if c == escape {
            match chars.get(i + 1) {
                Some(n) => cur.push(*n),
                None => cur.push(c),
            }
            i += 2;
        } else if c == '\'' {
            let end = chars[i + 1..]
                .iter()
                .position(|&x| x == '\'')
                .ok_or_else(|| format!("unterminated single quote in {text:?}"))?;
            cur.extend(&chars[i + 1..i + 1 + end]);
            i += end + 2;
        } else if c == '"' {
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(format!("unterminated double quote in {text:?}")),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some(&x) if x == escape && matches!(chars.get(i + 1), Some('"' | '$')) => {
                        cur.push(chars[i + 1]);
                        i += 2;
                    }
                    Some(&x) if x == escape && chars.get(i + 1) == Some(&escape) => {
                        cur.push(escape);
                        i += 2;
                    }
                    Some('$') => i = variable(&chars, i, escape, vars, &mut cur)?,
                    Some(&x) => {
                        cur.push(x);
                        i += 1;
                    }
                }
            }
        } else if c == '$' {
            i = variable(&chars, i, escape, vars, &mut cur)?;
        } else {
            cur.push(c);
            i += 1;
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Expands the variable at `chars[i] == '$'` into `out`; returns the index after it.
fn variable(
    chars: &[char],
    i: usize,
    escape: char,
    vars: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) -> Result<usize, String> {
    let name_at = |mut j: usize| {
        let s = j;
        while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
            j += 1;
        }
        (chars[s..j].iter().collect::<String>(), j)
    };
    match chars.get(i + 1) {
        Some('{') => {
            let (name, j) = name_at(i + 2);
            if name.is_empty() {
                return Err("${}: missing variable name".into());
            }
            match chars.get(j) {
                Some('}') => {
                    out.push_str(&vars(&name).unwrap_or_default());
                    Ok(j + 1)
                }
                Some(':') if matches!(chars.get(j + 1), Some('-' | '+')) => {
                    let op = chars[j + 1];
                    // The word runs to the matching brace.
                    let mut depth = 1;
                    let mut k = j + 2;
                    while k < chars.len() {
                        match chars[k] {
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        k += 1;
                    }
                    if k >= chars.len() {
                        return Err(format!("${{{name}:{op}...: missing '}}'"));
                    }
                    let word: String = chars[j + 2..k].iter().collect();
                    let word = words(&word, escape, vars)?.join(" ");
                    let value = vars(&name).filter(|v| !v.is_empty());
                    match (op, value) {
                        ('-', Some(v)) => out.push_str(&v),
                        ('-', None) => out.push_str(&word),
                        (_, Some(_)) => out.push_str(&word),
                        (_, None) => {}
                    }
                    Ok(k + 1)
                }
                _ => Err(format!(
                    "${{{name}...: unsupported substitution (supported: ${{VAR}}, ${{VAR:-word}}, ${{VAR:+word}})"
                )),
            }
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let (name, j) = name_at(i + 1);
            out.push_str(&vars(&name).unwrap_or_default());
            Ok(j)
        }
        _ => {
            out.push('$');
            Ok(i + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn steps(text: &str) -> Vec<Step> {
        let df = parse(text).unwrap();
        let mut out = Vec::new();
        for s in &df.stages {
            out.push(s.from.resolve(&|_| None).unwrap());
            for i in &s.instructions {
                out.push(i.resolve(&|_| None).unwrap());
            }
        }
        out
    }

    #[test]
    fn a_multi_stage_dockerfile_parses_into_stages_with_their_instructions() {
        let df = parse(
            "# syntax=docker/dockerfile:1\nARG BASE=busybox:1.36\nFROM $BASE AS build\nRUN echo hi > /out\n\nfrom build\ncopy --from=build /out /out\nCMD [\"cat\", \"/out\"]\n",
        )
        .unwrap();
        assert_eq!(df.global_args.len(), 1);
        assert_eq!(df.stages.len(), 2);
        assert_eq!(df.stages[0].name.as_deref(), Some("build"));
        assert_eq!(df.stages[0].from.line, 3);
        assert_eq!(df.stages[1].instructions.len(), 2);
        let from = df.stages[0]
            .from
            .resolve(&vars(&[("BASE", "busybox:1.36")]))
            .unwrap();
        assert_eq!(
            from,
            Step::From {
                base: "busybox:1.36".into(),
                name: Some("build".into()),
                platform: None
            }
        );
        assert_eq!(
            df.stages[1].instructions[1].resolve(&|_| None).unwrap(),
            Step::Cmd(Command::Exec(vec!["cat".into(), "/out".into()]))
        );
    }

    #[test]
    fn continuations_join_and_skip_comment_lines_inside() {
        let s = steps("FROM a\nRUN echo one \\\n# a comment\n   two \\\n\n  three\nENV A=1\n");
        assert_eq!(
            s[1],
            Step::Run(Command::Shell("echo one    two   three".into()))
        );
        assert_eq!(s[2], Step::Env(vec![("A".into(), "1".into())]));
    }

    #[test]
    fn the_escape_directive_changes_the_continuation_character() {
        let s = steps("# escape=`\nFROM a\nRUN dir c:\\ `\n  && echo x\n");
        assert_eq!(
            s[1],
            Step::Run(Command::Shell("dir c:\\   && echo x".into()))
        );
    }

    #[test]
    fn an_unknown_instruction_is_an_error_naming_its_line() {
        let e = parse("FROM a\n\nRUN true\nFROBNICATE x\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.to_string().contains("line 4"), "{e}");
        assert!(e.to_string().contains("FROBNICATE"), "{e}");
        let e = parse("FROM a\nVOLUME /data\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("not supported"), "{e}");
    }

    #[test]
    fn malformed_instructions_are_reported_at_parse_time_with_their_line() {
        for (text, line, needle) in [
            ("FROM a\nCOPY onlyone\n", 2, "destination"),
            ("FROM a\nEXPOSE http\n", 2, "EXPOSE"),
            ("FROM a\nSHELL /bin/sh -c\n", 2, "JSON array"),
            ("FROM a\nADD https://x/y.tgz /y\n", 2, "URL"),
            (
                "FROM a\nRUN --mount=type=cache,target=/c true\n",
                2,
                "--mount",
            ),
            ("RUN true\n", 1, "before the first FROM"),
            ("FROM a AS x\nFROM b AS x\n", 2, "twice"),
            ("# only a comment\n", 1, "no FROM"),
            ("FROM a\nENV A=\"unterminated\n", 2, "unterminated"),
            ("FROM a\nCOPY --link a b\n", 2, "--link"),
            ("FROM a\nUSER\n", 2, "needs arguments"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.reason.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn copy_and_add_take_flags_sources_and_a_destination() {
        let s = steps("FROM a\nCOPY --from=build --chown=1:1 --chmod=755 a \"b c\" /dst/\nADD [\"x.tar\", \"/opt\"]\n");
        assert_eq!(
            s[1],
            Step::Copy(CopySpec {
                add: false,
                from: Some("build".into()),
                chown: Some("1:1".into()),
                chmod: Some(0o755),
                sources: vec!["a".into(), "b c".into()],
                dest: "/dst/".into(),
            })
        );
        let Step::Copy(add) = &s[2] else {
            panic!("{:?}", s[2])
        };
        assert!(add.add);
        assert_eq!(add.sources, vec!["x.tar".to_string()]);
        assert_eq!(add.dest, "/opt");
    }

    #[test]
    fn env_label_arg_and_metadata_forms() {
        let s = steps(
            "FROM a\nENV A=1 B=\"two words\" C='$lit'\nENV LEGACY some value\nLABEL \"org.x\"=y z=\"w\"\nARG V=1 W\nWORKDIR /app\nUSER 65534:65534\nEXPOSE 80 53/udp 8000-8010\nENTRYPOINT /bin/sh\nSTOPSIGNAL SIGINT\nMAINTAINER me <me@x>\nSHELL [\"/bin/sh\", \"-ec\"]\n",
        );
        assert_eq!(
            s[1],
            Step::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "$lit".into())
            ])
        );
        assert_eq!(
            s[2],
            Step::Env(vec![("LEGACY".into(), "some value".into())])
        );
        assert_eq!(
            s[3],
            Step::Label(vec![("org.x".into(), "y".into()), ("z".into(), "w".into())])
        );
        assert_eq!(
            s[4],
            Step::Arg(vec![("V".into(), Some("1".into())), ("W".into(), None)])
        );
        assert_eq!(s[5], Step::Workdir("/app".into()));
        assert_eq!(s[6], Step::User("65534:65534".into()));
        assert_eq!(
            s[7],
            Step::Expose(vec![
                "80/tcp".into(),
                "53/udp".into(),
                "8000-8010/tcp".into()
            ])
        );
        assert_eq!(s[8], Step::Entrypoint(Command::Shell("/bin/sh".into())));
        assert_eq!(s[9], Step::StopSignal("SIGINT".into()));
        assert_eq!(
            s[10],
            Step::Label(vec![("maintainer".into(), "me <me@x>".into())])
        );
        assert_eq!(s[11], Step::Shell(vec!["/bin/sh".into(), "-ec".into()]));
    }

    #[test]
    fn variables_substitute_in_copy_env_workdir_but_not_in_run() {
        let df = parse("FROM a\nWORKDIR ${DIR:-/def}/sub\nENV P=$HOME:${X:+set}\nRUN echo $HOME\n")
            .unwrap();
        let v = vars(&[("HOME", "/root"), ("X", "1")]);
        let ins = &df.stages[0].instructions;
        assert_eq!(
            ins[0].resolve(&v).unwrap(),
            Step::Workdir("/def/sub".into())
        );
        assert_eq!(
            ins[1].resolve(&v).unwrap(),
            Step::Env(vec![("P".into(), "/root:set".into())])
        );
        assert_eq!(
            ins[2].resolve(&v).unwrap(),
            Step::Run(Command::Shell("echo $HOME".into()))
        );
    }

    #[test]
    fn words_split_quote_escape_and_never_split_a_substitution() {
        let v = vars(&[("S", "a b"), ("E", "")]);
        let w = |t: &str| words(t, '\\', &v).unwrap();
        assert_eq!(w("x $S y"), vec!["x", "a b", "y"]);
        assert_eq!(w("'$S' \"$S\""), vec!["$S", "a b"]);
        assert_eq!(w("a\\ b \\$S"), vec!["a b", "$S"]);
        assert_eq!(w("${E:-d} ${E:+no}x ${S:+yes}"), vec!["d", "x", "yes"]);
        assert_eq!(w("cost$ $5"), vec!["cost$", "$5"]);
        assert!(words("${S:?x}", '\\', &v).is_err());
    }

    #[test]
    fn shell_form_commands_run_under_the_shell() {
        let c = Command::Shell("echo hi".into());
        assert_eq!(
            c.argv(&["/bin/sh".into(), "-c".into()]),
            vec!["/bin/sh", "-c", "echo hi"]
        );
    }

    /// Property: any printable text either parses or fails with a line inside the file; it
    /// never panics.
    #[test]
    fn arbitrary_input_never_panics_and_errors_name_a_line_in_the_file() {
        let alphabet: Vec<char> = "FROM RUN COPY ADD ENV ARG \\`'\"$\n{}[]=:-+#\t aA"
            .chars()
            .collect();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..3000 {
            let len = (seed % 80) as usize;
            let mut text = String::new();
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                text.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            if let Err(e) = parse(&text) {
                assert!(
                    e.line >= 1 && e.line <= text.lines().count().max(1),
                    "{text:?}: {e}"
                );
            }
        }
    }
}

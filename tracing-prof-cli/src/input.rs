//! Reading a profile from a file, standard input or a `/debug/pprof` URL, with bounds: the
//! bytes read are capped before decoding, and decoding caps what they may expand to.

use std::io::Read as _;
use std::time::{Duration, SystemTime};
use tracing_prof_model::{DecodeError, Profile, units};

/// Bytes read from any source at most: 512 MiB (the decoder accepts 256 MiB decompressed).
pub(crate) const MAX_INPUT_BYTES: u64 = 512 << 20;
/// How long a URL may take to answer: a `?seconds=60` window, and some.
pub(crate) const URL_TIMEOUT: Duration = Duration::from_secs(120);

/// Why an input could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InputError {
    #[error("cannot read {name}: {source}")]
    Io {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} is larger than {} MiB: not a profile", MAX_INPUT_BYTES >> 20)]
    TooLarge { name: String },
    #[error("cannot fetch {name}: {message}")]
    Fetch { name: String, message: String },
    #[error("{name} is a directory with no .pb.gz profile in it")]
    NoProfiles { name: String },
    #[error("{name}: {source}")]
    Decode {
        name: String,
        #[source]
        source: DecodeError,
    },
}

/// A profile and where it came from.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// The path or URL as given (`-`: standard input).
    pub(crate) name: String,
    pub(crate) profile: Profile,
}

impl Loaded {
    /// The file name less its directory and `.pb.gz` (`pb`, `.gz`), for output names.
    pub(crate) fn stem(&self) -> String {
        let base = self
            .name
            .rsplit(['/', '?'])
            .find(|s| !s.is_empty())
            .unwrap_or("profile");
        let base = if self.name != "-" && is_url(&self.name) {
            // .../debug/pprof/heap?seconds=5: the endpoint's name.
            self.name
                .split('?')
                .next()
                .and_then(|p| p.rsplit('/').find(|s| !s.is_empty()))
                .unwrap_or("profile")
        } else if self.name == "-" {
            "stdin"
        } else {
            base
        };
        let base = base.strip_suffix(".gz").unwrap_or(base);
        let base = base.strip_suffix(".pb").unwrap_or(base);
        let base = base.strip_suffix(".pprof").unwrap_or(base);
        base.to_owned()
    }

    /// The kind, guessed from a tracing-prof file name (`heap.PID.STAMP.RUN.pb.gz`,
    /// `heap.latest.pb.gz`) or a `/debug/pprof/heap` URL; `None` for other names.
    pub(crate) fn kind(&self) -> Option<String> {
        const KINDS: [&str; 8] = [
            "spans",
            "cpu",
            "span_memory",
            "heap",
            "allocs",
            "lifetimes",
            "threads",
            "profile",
        ];
        let stem = self.stem();
        let first = stem.split('.').next().unwrap_or("");
        let first = first.strip_suffix("-delta").unwrap_or(first);
        KINDS
            .contains(&first)
            .then(|| if first == "profile" { "cpu" } else { first }.to_owned())
    }

    /// The process id in one of our file names (`heap.4242.20261122T120205.123456Z.pb.gz`).
    pub(crate) fn pid(&self) -> Option<i64> {
        self.kind()?;
        let stem = self.stem();
        let mut parts = stem.split('.');
        parts.next();
        parts.next()?.parse().ok()
    }

    /// The process id of one of our timestamped files, the pid followed by its stamp
    /// (`heap.4242.20261122T120205.123456Z.pb.gz`); `None` for any other name.
    pub(crate) fn process(&self) -> Option<i64> {
        let stem = self.stem();
        let stamp = stem.split('.').nth(2)?.as_bytes();
        let is_stamp = stamp.len() == 15
            && stamp[8] == b'T'
            && stamp
                .iter()
                .enumerate()
                .all(|(i, b)| i == 8 || b.is_ascii_digit());
        if is_stamp { self.pid() } else { None }
    }

    /// Whether it is one of our cumulative captures (it says so in a comment).
    pub(crate) fn is_our_cumulative(&self) -> bool {
        self.profile
            .comments
            .iter()
            .any(|c| c.starts_with("tracing-prof: cumulative"))
    }

    /// What one of our memory profiles says of the process's resident memory at its capture
    /// (RSS, anonymous and file, the heap, what the heap does not explain).
    pub(crate) fn process_memory(&self) -> Option<&str> {
        self.profile
            .comments
            .iter()
            .find_map(|c| c.strip_prefix("tracing-prof: process memory: "))
    }

    /// One line: the name, the program, when (the window's start, or when it was taken) and
    /// over how long.
    pub(crate) fn describe(&self) -> String {
        let p = &self.profile;
        let mut parts = vec![self.name.clone()];
        if let Some(b) = &p.binary {
            parts.push(b.path.rsplit('/').next().unwrap_or(&b.path).to_owned());
        }
        // Our profiles with a duration are stamped with the start of what they cover (the
        // profiler's start, or a window's: the file is written at its end); other programs'
        // times are the one pprof calls the time of collection, which Go sets to a CPU
        // profile's start but to a delta heap profile's end.
        let window = p.duration.filter(|d| !d.is_zero());
        if let Some(t) = p.time {
            let ours = p.comments.iter().any(|c| c.starts_with("tracing-prof: "));
            let when = if window.is_some() && ours {
                "from"
            } else {
                "taken"
            };
            parts.push(format!("{when} {}", utc(t)));
        }
        if let Some(d) = window {
            parts.push(format!(
                "over {}",
                units::format_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            ));
        }
        // A heap at its peak says which and when (its comment goes on to how it was read).
        if let Some(peak) = p.comments.iter().find_map(|c| {
            c.strip_prefix("tracing-prof: ")
                .filter(|c| c.starts_with("at the peak of "))
        }) {
            parts.push(peak.split("; ").next().unwrap_or(peak).to_owned());
        }
        parts.join(", ")
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(t: SystemTime) -> String {
    units::format_utc_seconds(t)
}

/// Whether `given` names a service (`http://host:6060/...`, or `host:6060/...` without the
/// scheme) rather than a file: a URL, or no file of that name and a `host:port`.
pub(crate) fn is_url(given: &str) -> bool {
    given.starts_with("http://")
        || given.starts_with("https://")
        || (!std::path::Path::new(given).exists()
            && given
                .split('/')
                .next()
                .and_then(|host| host.rsplit_once(':'))
                .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok()))
}

/// `given` with `http://` in front when it has no scheme.
pub(crate) fn with_scheme(given: &str) -> String {
    if given.contains("://") {
        given.to_owned()
    } else {
        format!("http://{given}")
    }
}

/// Reads and decodes every input, in order; a directory stands for the `*.pb.gz` files
/// directly in it, by name (a profile directory's top level: the newest profile of each kind;
/// its `captures/`: every capture, oldest first). Other files in it, such as the exporter's
/// `README.txt`, are skipped.
pub(crate) fn load_all(sources: &[String]) -> Result<Vec<Loaded>, InputError> {
    let mut loaded = Vec::new();
    for source in sources {
        let is_dir =
            source != "-" && !is_url(source) && std::fs::metadata(source).is_ok_and(|m| m.is_dir());
        if !is_dir {
            loaded.push(load(source)?);
            continue;
        }
        let io = |e| InputError::Io {
            name: source.clone(),
            source: e,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(source).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let is_profile = name.to_str().is_some_and(|n| n.ends_with(".pb.gz"));
            if is_profile && entry.path().is_file() {
                files.push(entry.path());
            }
        }
        if files.is_empty() {
            return Err(InputError::NoProfiles {
                name: source.clone(),
            });
        }
        files.sort();
        for file in files {
            loaded.push(load(&file.to_string_lossy())?);
        }
    }
    Ok(loaded)
}

/// Reads and decodes one input: a path, `-` (standard input) or a URL (`http(s)://`, or
/// `host:port/...` without the scheme, as `live` takes it).
pub(crate) fn load(source: &str) -> Result<Loaded, InputError> {
    let name = source.to_owned();
    let bytes = if source != "-" && is_url(source) {
        fetch(&with_scheme(source))?
    } else if source == "-" {
        read_capped(std::io::stdin().lock(), &name)?
    } else {
        let file = std::fs::File::open(source).map_err(|e| InputError::Io {
            name: name.clone(),
            source: e,
        })?;
        read_capped(file, &name)?
    };
    let profile = Profile::decode(&bytes).map_err(|source| InputError::Decode {
        name: name.clone(),
        source,
    })?;
    Ok(Loaded { name, profile })
}

fn read_capped(r: impl std::io::Read, name: &str) -> Result<Vec<u8>, InputError> {
    let mut bytes = Vec::new();
    r.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError::Io {
            name: name.to_owned(),
            source: e,
        })?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(InputError::TooLarge {
            name: name.to_owned(),
        });
    }
    Ok(bytes)
}

fn fetch(url: &str) -> Result<Vec<u8>, InputError> {
    http_get(url, URL_TIMEOUT).map_err(|f| match f {
        HttpFailure::TooLarge => InputError::TooLarge {
            name: url.to_owned(),
        },
        f => InputError::Fetch {
            name: url.to_owned(),
            message: f.to_string(),
        },
    })
}

/// What an error answer says, in at most 120 characters of one line: an HTML page's title
/// (or its text), or a plain answer's first line.
fn summary(body: &str) -> String {
    let text = if body.contains("<html") || body.contains("<HTML") || body.contains("<!DOCTYPE") {
        let lower = body.to_ascii_lowercase();
        match (lower.find("<title>"), lower.find("</title>")) {
            (Some(a), Some(b)) if b > a + 7 => body[a + 7..b].to_owned(),
            _ => {
                // The text between the tags.
                let mut out = String::new();
                let mut in_tag = false;
                for c in body.chars() {
                    match c {
                        '<' => in_tag = true,
                        '>' => {
                            in_tag = false;
                            out.push(' ');
                        }
                        c if !in_tag => out.push(c),
                        _ => {}
                    }
                }
                out
            }
        }
    } else {
        body.lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_owned()
    };
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 120 {
        format!("{}...", one_line.chars().take(117).collect::<String>())
    } else {
        one_line
    }
}

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpFailure {
    /// The server answered with this status; the start of its answer follows.
    #[error("HTTP {0}: {1}")]
    Status(u16, String),
    /// No answer: refused, timed out, reset, name unknown.
    #[error("{0}")]
    Transport(String),
    /// The answer is larger than [`MAX_INPUT_BYTES`].
    #[error("the answer is larger than {} MiB", MAX_INPUT_BYTES >> 20)]
    TooLarge,
}

/// GETs `url` with `TRACING_PROF_HTTP_TOKEN` as a bearer token when set, the answer capped at
/// [`MAX_INPUT_BYTES`].
pub(crate) fn http_get(url: &str, timeout: Duration) -> Result<Vec<u8>, HttpFailure> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut request = agent.get(url);
    if let Ok(token) = std::env::var("TRACING_PROF_HTTP_TOKEN") {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    match request.call() {
        Ok(response) => read_capped(response.into_reader(), url).map_err(|e| match e {
            InputError::TooLarge { .. } => HttpFailure::TooLarge,
            e => HttpFailure::Transport(e.to_string()),
        }),
        Err(ureq::Error::Status(code, response)) => {
            let status = response.status_text().to_owned();
            let body = response.into_string().unwrap_or_default();
            let said = summary(&body);
            Err(HttpFailure::Status(
                code,
                if said.is_empty() { status } else { said },
            ))
        }
        Err(ureq::Error::Transport(t)) => {
            // ureq's own text repeats the URL; the kind and the cause say it shorter.
            let cause = std::error::Error::source(&t)
                .map(ToString::to_string)
                .or_else(|| t.message().map(str::to_owned))
                .unwrap_or_default();
            Err(HttpFailure::Transport(format!("{}: {cause}", t.kind())))
        }
    }
}

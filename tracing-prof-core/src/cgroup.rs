//! The memory limit of the process's cgroup and its usage as the OOM killer and the kubelet
//! see it: the working set (usage less inactive file pages), not the raw usage, which counts
//! page cache any file-reading service fills.
//!
//! The hierarchy that holds the memory controller is found from `/proc/self/mountinfo` and
//! `/proc/self/cgroup`: cgroup v1's `memory` hierarchy where one is mounted (hosts mix v1 and
//! v2: a v1 memory controller beside an empty v2 hierarchy), else v2's unified hierarchy when
//! its `cgroup.controllers` lists `memory`. A limit set on a parent counts, so every level from
//! the process's cgroup up to the hierarchy's root is read, and the level with the least room
//! left is the one reported.

use std::path::{Path, PathBuf};
use tracing_prof_model::CgroupMemory;

/// v1's "no limit": `memory.limit_in_bytes` reads about 2^63 (rounded to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// Where the process's memory controller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemoryCgroup {
    /// 1 or 2.
    version: u8,
    /// The hierarchy's mount point (as seen under the root).
    mount: PathBuf,
    /// The process's cgroup directory, under `mount`.
    dir: PathBuf,
    /// The process's cgroup as `/proc/self/cgroup` names it.
    name: String,
}

impl MemoryCgroup {
    /// The process's memory cgroup, from `root`'s `proc/self/mountinfo` and `proc/self/cgroup`
    /// (`root` is `/`, or a test's copy of those files and the hierarchies they name).
    pub(crate) fn find(root: &Path) -> Option<MemoryCgroup> {
        let mountinfo = std::fs::read_to_string(root.join("proc/self/mountinfo")).ok()?;
        let cgroup = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
        let mounts = mounts(&mountinfo);
        let under_root = |p: &str| root.join(p.trim_start_matches('/'));
        // The mount of `fstype` (with `option`) whose root holds the cgroup `name`: a
        // container's mount shows only its own subtree.
        let mount_of = |fstype: &str, option: Option<&str>, name: &str| {
            mounts.iter().find(|m| {
                m.fstype == fstype
                    && option.is_none_or(|o| m.options.split(',').any(|x| x == o))
                    && relative(name, &m.root).is_some()
            })
        };
        // v1: our line that lists `memory`, and the hierarchy that holds it.
        if let Some(name) = cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        }) && let Some(m) = mount_of("cgroup", Some("memory"), &name)
        {
            let mount = under_root(&m.mount_point);
            let dir = mount.join(relative(&name, &m.root)?);
            return Some(MemoryCgroup {
                version: 1,
                mount,
                dir,
                name,
            });
        }
        // v2: the unified hierarchy, when the memory controller is on for our cgroup (its
        // `cgroup.controllers` lists what its parent enabled for it).
        let name = cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .to_owned();
        let m = mount_of("cgroup2", None, &name)?;
        let mount = under_root(&m.mount_point);
        let dir = mount.join(relative(&name, &m.root)?);
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
        controllers
            .split_whitespace()
            .any(|c| c == "memory")
            .then_some(MemoryCgroup {
                version: 2,
                mount,
                dir,
                name,
            })
    }

    /// Whether some level from the process's cgroup up has a memory limit (read once, at
    /// start: without one there is nothing to watch).
    pub(crate) fn has_limit(&self) -> bool {
        self.levels().any(|dir| self.limit(dir).is_some())
    }

    /// The process's cgroup directory and each one above it, up to the hierarchy's root.
    fn levels(&self) -> impl Iterator<Item = &Path> {
        self.dir
            .ancestors()
            .take_while(|d| d.starts_with(&self.mount))
    }

    /// A level's limit, when it has one.
    fn limit(&self, dir: &Path) -> Option<u64> {
        if self.version == 2 {
            // "max": none.
            std::fs::read_to_string(dir.join("memory.max"))
                .ok()?
                .trim()
                .parse()
                .ok()
        } else {
            std::fs::read_to_string(dir.join("memory.limit_in_bytes"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&l| l < V1_UNLIMITED)
        }
    }

    /// The limit and usage now, at the level from the process's cgroup up with the least room
    /// left; `None` when no level has a limit.
    pub(crate) fn read(&self) -> Option<CgroupMemory> {
        let mut best: Option<CgroupMemory> = None;
        for dir in self.levels() {
            if let Some(level) = self.level(dir)
                && best.as_ref().is_none_or(|b| room(&level) < room(b))
            {
                best = Some(level);
            }
        }
        let mut best = best?;
        // OOM kills in the process's own cgroup (a parent's count its other children's too).
        best.oom_kills = self.oom_kills(&self.dir);
        Some(best)
    }

    /// OOM kills in the cgroup at `dir` (`memory.events` or `memory.oom_control`).
    fn oom_kills(&self, dir: &Path) -> Option<u64> {
        let file = if self.version == 2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
    }

    /// One level's limit and working set, when it has a limit (read first: a level without
    /// one costs one small file).
    fn level(&self, dir: &Path) -> Option<CgroupMemory> {
        let limit = self.limit(dir)?;
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let stat = read("memory.stat").unwrap_or_default();
        let stat_field = |key: &str| {
            stat.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
        };
        let (usage, inactive_file) = if self.version == 2 {
            (
                read("memory.current")?.trim().parse::<u64>().ok()?,
                stat_field("inactive_file").unwrap_or(0),
            )
        } else {
            (
                read("memory.usage_in_bytes")?.trim().parse::<u64>().ok()?,
                stat_field("total_inactive_file")
                    .or_else(|| stat_field("inactive_file"))
                    .unwrap_or(0),
            )
        };
        let level = dir
            .strip_prefix(&self.mount)
            .map(|p| format!("/{}", p.display()))
            .unwrap_or_else(|_| self.name.clone());
        let mut m = CgroupMemory::new(self.version, level, limit);
        m.usage_bytes = usage;
        m.working_set_bytes = usage.saturating_sub(inactive_file);
        Some(m)
    }
}

/// Bytes left before the limit, by the working set.
fn room(m: &CgroupMemory) -> u64 {
    m.limit_bytes.saturating_sub(m.working_set_bytes)
}

/// `path` (a cgroup, as `/proc/self/cgroup` names it) relative to a mount whose root is
/// `root` (a container's mount shows only its own subtree); `None` when the mount does not
/// hold it. Compared by path components: `/docker/abc` does not hold `/docker/abcd`.
fn relative<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let rest = Path::new(path).strip_prefix(root).ok()?;
    let rest = rest.to_str()?;
    Some(rest.trim_start_matches('/'))
}

/// A `mountinfo` field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One line of `mountinfo`: what the cgroup search needs.
struct Mount {
    root: String,
    mount_point: String,
    fstype: String,
    options: String,
}

/// The mounts of a `mountinfo` text (`ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] -
/// FSTYPE SOURCE SUPER_OPTS`).
fn mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            let mut b = before.split(' ');
            let root = unescape(b.nth(3)?);
            let mount_point = unescape(b.next()?);
            let mut a = after.split(' ');
            let fstype = a.next()?.to_owned();
            let options = a.nth(1).unwrap_or("").to_owned();
            Some(Mount {
                root,
                mount_point,
                fstype,
                options,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (path under root, text) under a new temporary root.
    fn root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

    #[test]
    fn v1_the_tightest_level_counts_and_page_cache_does_not() {
        let m = 1u64 << 20;
        let dir = "sys/fs/cgroup/memory/kubepods/pod1/ctr";
        let r = root(&[
            ("proc/self/mountinfo", V1_MOUNTS),
            (
                "proc/self/cgroup",
                "4:memory:/kubepods/pod1/ctr\n1:cpu:/\n0::/\n",
            ),
            // The container: no limit of its own.
            (
                &format!("{dir}/memory.limit_in_bytes"),
                "9223372036854771712\n",
            ),
            (
                &format!("{dir}/memory.usage_in_bytes"),
                &format!("{}\n", 300 * m),
            ),
            (
                &format!("{dir}/memory.stat"),
                &format!("inactive_file 5\ntotal_inactive_file {}\n", 100 * m),
            ),
            (
                &format!("{dir}/memory.oom_control"),
                "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            ),
            // The pod: 512 MiB, 450 MiB used of which 200 MiB inactive page cache.
            (
                "sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes",
                &format!("{}\n", 512 * m),
            ),
            (
                "sys/fs/cgroup/memory/kubepods/pod1/memory.usage_in_bytes",
                &format!("{}\n", 450 * m),
            ),
            (
                "sys/fs/cgroup/memory/kubepods/pod1/memory.stat",
                &format!("total_inactive_file {}\n", 200 * m),
            ),
            // Above: 4 GiB, far from full.
            (
                "sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes",
                &format!("{}\n", 4096 * m),
            ),
            (
                "sys/fs/cgroup/memory/kubepods/memory.usage_in_bytes",
                &format!("{}\n", 1000 * m),
            ),
        ]);
        let cg = MemoryCgroup::find(r.path()).unwrap();
        assert_eq!(cg.version, 1);
        let now = cg.read().unwrap();
        assert_eq!(now.level, "/kubepods/pod1");
        assert_eq!(now.limit_bytes, 512 * m);
        assert_eq!(now.usage_bytes, 450 * m);
        assert_eq!(now.working_set_bytes, 250 * m);
        assert_eq!(now.oom_kills, Some(2), "the container's own kills");
    }

    #[test]
    fn mounts_are_matched_by_whole_path_components_and_unescaped() {
        // A mount whose root is `/docker/abc` does not hold `/docker/abcd`.
        assert_eq!(relative("/docker/abcd/x", "/docker/abc"), None);
        assert_eq!(relative("/docker/abc/x", "/docker/abc"), Some("x"));
        assert_eq!(relative("/a", "/"), Some("a"));
        assert_eq!(unescape("/sys/fs/my\\040cgroup"), "/sys/fs/my cgroup");
        assert_eq!(unescape("a\\9b"), "a\\9b", "not an escape: left as it is");
        let r = root(&[
            (
                "proc/self/mountinfo",
                "35 31 0:32 /docker/abc /sys/fs/cgroup/memory\\040x ro - cgroup cgroup rw,memory\n",
            ),
            ("proc/self/cgroup", "4:memory:/docker/abcd\n"),
        ]);
        assert_eq!(
            MemoryCgroup::find(r.path()),
            None,
            "that mount does not hold it"
        );
        let r = root(&[
            (
                "proc/self/mountinfo",
                "35 31 0:32 /docker/abc /sys/fs/cgroup/memory\\040x ro - cgroup cgroup rw,memory\n",
            ),
            ("proc/self/cgroup", "4:memory:/docker/abc\n"),
            ("sys/fs/cgroup/memory x/memory.limit_in_bytes", "1048576\n"),
            ("sys/fs/cgroup/memory x/memory.usage_in_bytes", "1024\n"),
        ]);
        let cg = MemoryCgroup::find(r.path()).unwrap();
        assert!(cg.has_limit());
        assert_eq!(cg.read().unwrap().limit_bytes, 1 << 20);
    }

    #[test]
    fn v2_memory_max_walked_up_and_max_is_none() {
        let m = 1u64 << 20;
        let r = root(&[
            (
                "proc/self/mountinfo",
                "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
            ),
            ("proc/self/cgroup", "0::/system.slice/app.service\n"),
            (
                "sys/fs/cgroup/cgroup.controllers",
                "cpuset cpu io memory pids\n",
            ),
            (
                "sys/fs/cgroup/system.slice/app.service/cgroup.controllers",
                "memory pids\n",
            ),
            (
                "sys/fs/cgroup/system.slice/app.service/memory.max",
                &format!("{}\n", 256 * m),
            ),
            (
                "sys/fs/cgroup/system.slice/app.service/memory.current",
                &format!("{}\n", 240 * m),
            ),
            (
                "sys/fs/cgroup/system.slice/app.service/memory.stat",
                &format!("anon 1\ninactive_file {}\nactive_file 3\n", 40 * m),
            ),
            (
                "sys/fs/cgroup/system.slice/app.service/memory.events",
                "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
            ),
            ("sys/fs/cgroup/system.slice/memory.max", "max\n"),
            ("sys/fs/cgroup/system.slice/memory.current", "1\n"),
        ]);
        let cg = MemoryCgroup::find(r.path()).unwrap();
        assert_eq!(cg.version, 2);
        let now = cg.read().unwrap();
        assert_eq!(
            (
                now.level.as_str(),
                now.limit_bytes,
                now.working_set_bytes,
                now.oom_kills
            ),
            ("/system.slice/app.service", 256 * m, 200 * m, Some(1))
        );
    }

    #[test]
    fn a_mixed_host_uses_v1s_memory_hierarchy_and_none_without_a_limit() {
        // This project's machines: v1 controllers, an empty v2 hierarchy beside them.
        let mounts = format!(
            "{V1_MOUNTS}41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        );
        let r = root(&[
            ("proc/self/mountinfo", &mounts),
            (
                "proc/self/cgroup",
                "4:memory:/process_api/17ee\n1:cpu:/\n0::/\n",
            ),
            ("sys/fs/cgroup/unified/cgroup.controllers", ""),
            (
                "sys/fs/cgroup/memory/process_api/17ee/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "sys/fs/cgroup/memory/process_api/17ee/memory.usage_in_bytes",
                "1000\n",
            ),
            (
                "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let cg = MemoryCgroup::find(r.path()).unwrap();
        assert_eq!((cg.version, cg.name.as_str()), (1, "/process_api/17ee"));
        assert_eq!(cg.read(), None, "no level has a limit");
        assert!(!cg.has_limit(), "so nothing is watched");
        // Only v2, its memory controller off: no memory cgroup at all.
        let r = root(&[
            (
                "proc/self/mountinfo",
                "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            ),
            ("proc/self/cgroup", "0::/\n"),
            ("sys/fs/cgroup/cgroup.controllers", "cpu pids\n"),
        ]);
        assert_eq!(MemoryCgroup::find(r.path()), None);
    }

    #[test]
    fn a_containers_mount_shows_its_own_subtree() {
        let r = root(&[
            (
                "proc/self/mountinfo",
                "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
            ),
            ("proc/self/cgroup", "4:memory:/docker/abc\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "1048576\n"),
            ("sys/fs/cgroup/memory/memory.usage_in_bytes", "524288\n"),
        ]);
        let cg = MemoryCgroup::find(r.path()).unwrap();
        let now = cg.read().unwrap();
        assert_eq!((now.level.as_str(), now.limit_bytes), ("/", 1 << 20));
    }
}

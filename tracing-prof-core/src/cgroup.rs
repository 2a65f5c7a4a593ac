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
        // v1: the hierarchy whose super options name `memory`, and our line that lists it.
        if let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == "memory"))
            && let Some(name) = cgroup.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "memory")
                    .then(|| path.to_owned())
            })
        {
            let mount = under_root(&m.mount_point);
            let dir = mount.join(relative(&name, &m.root));
            return Some(MemoryCgroup {
                version: 1,
                mount,
                dir,
                name,
            });
        }
        // v2: the unified hierarchy, when the memory controller is on in it.
        let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
        let name = cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .to_owned();
        let mount = under_root(&m.mount_point);
        let dir = mount.join(relative(&name, &m.root));
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))
            .or_else(|_| std::fs::read_to_string(mount.join("cgroup.controllers")))
            .ok()?;
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

    /// The limit and usage now, at the level from the process's cgroup up with the least room
    /// left; `None` when no level has a limit.
    pub(crate) fn read(&self) -> Option<CgroupMemory> {
        let mut best: Option<CgroupMemory> = None;
        let mut dir = self.dir.as_path();
        loop {
            if let Some(level) = self.level(dir)
                && best.as_ref().is_none_or(|b| room(&level) < room(b))
            {
                best = Some(level);
            }
            if dir == self.mount {
                break;
            }
            match dir.parent() {
                Some(parent) if parent.starts_with(&self.mount) => dir = parent,
                _ => break,
            }
        }
        best
    }

    /// One level's limit and working set, when it has a limit.
    fn level(&self, dir: &Path) -> Option<CgroupMemory> {
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let number = |file: &str| read(file)?.trim().parse::<u64>().ok();
        let stat = read("memory.stat").unwrap_or_default();
        let stat_field = |key: &str| {
            stat.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
        };
        let (limit, usage, inactive_file, events) = if self.version == 2 {
            let limit = read("memory.max")?.trim().parse::<u64>().ok()?; // "max": none
            (
                limit,
                number("memory.current")?,
                stat_field("inactive_file").unwrap_or(0),
                read("memory.events"),
            )
        } else {
            let limit = number("memory.limit_in_bytes").filter(|&l| l < V1_UNLIMITED)?;
            (
                limit,
                number("memory.usage_in_bytes")?,
                stat_field("total_inactive_file")
                    .or_else(|| stat_field("inactive_file"))
                    .unwrap_or(0),
                read("memory.oom_control"),
            )
        };
        let oom_kills = events.and_then(|e| {
            e.lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
        });
        let level = dir
            .strip_prefix(&self.mount)
            .map(|p| format!("/{}", p.display()))
            .unwrap_or_else(|_| self.name.clone());
        let mut m = CgroupMemory::new(self.version, level, limit);
        m.usage_bytes = usage;
        m.working_set_bytes = usage.saturating_sub(inactive_file);
        m.oom_kills = oom_kills;
        Some(m)
    }
}

/// Bytes left before the limit, by the working set.
fn room(m: &CgroupMemory) -> u64 {
    m.limit_bytes.saturating_sub(m.working_set_bytes)
}

/// `path` (a cgroup, as `/proc/self/cgroup` names it) relative to a mount whose root is
/// `root` (a container's mount shows only its own subtree).
fn relative<'a>(path: &'a str, root: &str) -> &'a str {
    let rest = if root == "/" {
        path
    } else {
        path.strip_prefix(root).unwrap_or(path)
    };
    rest.trim_start_matches('/')
}

/// One line of `mountinfo`: what the cgroup search needs.
struct Mount {
    root: String,
    mount_point: String,
    fstype: String,
    options: String,
}

/// The mounts of a `mountinfo` text (`ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] -
/// FSTYPE SOURCE SUPER_OPTS`; escapes such as `\040` are left as they are).
fn mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            let mut b = before.split(' ');
            let root = b.nth(3)?.to_owned();
            let mount_point = b.next()?.to_owned();
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
        assert_eq!(
            now.oom_kills, None,
            "the pod's level has no oom_control here"
        );
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

//! Symbolizers side by side (command 16 in BENCHMARKS.md): ours (tracing-prof-core's, as a first
//! export runs it), addr2line 0.27 and blazesym 0.2, on one fixed set of addresses of this
//! binary: the return addresses of its own workload (tokio tasks, channels, sorting, maps,
//! formatting, inlined helpers, async fns) and a point inside every third function of its symbol
//! table. Each run is a fresh process (`child WHICH OUT`) that resolves the set twice and prints
//! the time, allocations, heap peak and resident set each resolution added; the bench alternates
//! the three for `TRACING_PROF_BENCH_ROUNDS` rounds (default 5), prints medians, then compares
//! the three outputs address by address (names, frame counts, file:line; how many short names
//! cover code in more than one file, a lower bound of distinct functions shown as one).
//!
//! The debug level is the bench profile's (`line-tables-only` in this workspace);
//! `CARGO_PROFILE_BENCH_DEBUG=limited` for `limited`. `objcopy --strip-debug` of the binary
//! and `TRACING_PROF_SYMBENCH_EXE=copy` measures names from symbol tables only.
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

// ---- counting allocator ----
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
fn note(add: usize, sub: usize) {
    let live = LIVE
        .fetch_add((add as u64).wrapping_sub(sub as u64), Relaxed)
        .wrapping_add(add as u64)
        .wrapping_sub(sub as u64);
    PEAK.fetch_max(live, Relaxed);
}
// SAFETY: every method passes its arguments on to `System`, which meets GlobalAlloc's
// contract; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(l.size() as u64, Relaxed);
        note(l.size(), 0);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(0, l.size());
        // SAFETY: a block of `System` (every block is), with its layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new as u64, Relaxed);
        note(new, l.size());
        // SAFETY: a block of `System` with its layout, and the caller's new size.
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- workload: return addresses captured at many points ----
unsafe extern "C" {
    fn backtrace(buf: *mut *mut std::ffi::c_void, size: i32) -> i32;
}
/// Distinct stacks, and the number of captures.
static STACKS: Mutex<BTreeSet<Vec<usize>>> = Mutex::new(BTreeSet::new());
static TICK: AtomicU64 = AtomicU64::new(0);
#[inline(never)]
fn grab() {
    let mut buf = [std::ptr::null_mut(); 256];
    // SAFETY: glibc's backtrace(3) writes at most `size` pointers into `buf`.
    let n = unsafe { backtrace(buf.as_mut_ptr(), 256) } as usize;
    TICK.fetch_add(1, Relaxed);
    STACKS
        .lock()
        .unwrap()
        .insert(buf[..n].iter().map(|p| *p as usize).collect());
}
#[inline(always)]
fn leaf_a(x: u64) -> u64 {
    grab();
    x.wrapping_mul(3)
}
#[inline(always)]
fn mid_a(x: u64) -> u64 {
    leaf_a(x) + 1
}
#[inline]
fn top_a(x: u64) -> u64 {
    mid_a(x) ^ 5
}
struct Account {
    id: u64,
}
impl Account {
    #[inline(always)]
    fn new(id: u64) -> Self {
        grab();
        Self { id }
    }
}
struct Order {
    n: u64,
}
impl Order {
    #[inline(always)]
    fn new(n: u64) -> Self {
        grab();
        Self { n: n + 1 }
    }
}
#[inline(never)]
fn generic_work<T: std::fmt::Debug>(t: T) -> String {
    grab();
    format!("{t:?}")
}
/// A value whose every trait impl captures a stack: called from inside std's and tokio's code.
#[derive(Debug)]
struct Key(u32);
impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        grab();
        write!(f, "<{}>", self.0)
    }
}
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        grab();
        self.0.hash(h)
    }
}
impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        grab();
        self.0 == o.0
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        grab();
        self.0.cmp(&o.0)
    }
}
impl Clone for Key {
    fn clone(&self) -> Self {
        grab();
        Key(self.0)
    }
}
impl Drop for Key {
    fn drop(&mut self) {
        if self.0.is_multiple_of(5) {
            grab()
        }
    }
}
struct Counter(u32);
impl Iterator for Counter {
    type Item = Key;
    fn next(&mut self) -> Option<Key> {
        grab();
        self.0 = self.0.checked_sub(1)?;
        Some(Key(self.0 * 7919 % 101))
    }
}
struct Src(u32);
impl std::io::Read for Src {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        grab();
        self.0 = self.0.saturating_sub(1);
        let n = buf.len().min(7) * (self.0 > 0) as usize;
        buf[..n].fill(b'a' + (self.0 % 3) as u8);
        if n > 0 {
            buf[n - 1] = b'\n'
        }
        Ok(n)
    }
}
struct Sink;
impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        grab();
        Ok(b.len().min(5))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        grab();
        Ok(())
    }
}
async fn fetch(i: u64) -> u64 {
    tokio::task::yield_now().await;
    grab();
    top_a(i)
}
async fn validate(i: u64) -> u64 {
    let acct = Account::new(i);
    grab();
    acct.id
}
async fn handle(i: u64) -> u64 {
    let a = fetch(i).await;
    let b = async {
        grab();
        a + 1
    }
    .await;
    b + validate(i).await + Order::new(i).n
}
async fn stage<T: std::fmt::Debug + Send>(t: T, m: &tokio::sync::Mutex<Vec<String>>) {
    let s = generic_work(t);
    grab();
    m.lock().await.push(s)
}
fn workload() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(4);
        let consumer = tokio::spawn(async move {
            let mut sum = 0;
            while let Some(v) = rx.recv().await {
                grab();
                sum += v;
            }
            sum
        });
        let tasks: Vec<_> = (0..8).map(|i| tokio::spawn(handle(i))).collect();
        for t in tasks {
            tx.send(t.await.unwrap()).await.unwrap();
        }
        drop(tx);
        let (otx, orx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            grab();
            otx.send(consumer.await.unwrap()).unwrap()
        });
        orx.await.unwrap();
        let m = tokio::sync::Mutex::new(Vec::new());
        let (a, b, c) = tokio::join!(stage(1u8, &m), stage("s", &m), stage(Key(3), &m));
        std::hint::black_box((a, b, c));
        let (wtx, mut wrx) = tokio::sync::watch::channel(0u32);
        let w = tokio::spawn(async move {
            while wrx.changed().await.is_ok() {
                grab();
            }
        });
        for i in 1..4 {
            wtx.send(i).unwrap();
            tokio::task::yield_now().await;
        }
        drop(wtx);
        w.await.unwrap();
        let sem = tokio::sync::Semaphore::new(1);
        tokio::select! { p = sem.acquire() => { grab(); drop(p) }, _ = fetch(9) => {} }
    });
    let mut keys: Vec<Key> = Counter(40).collect();
    keys.sort();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    keys.sort_by_key(|k| Key(k.0 / 2));
    let _ = keys.binary_search(&Key(50));
    keys.dedup();
    let _ = (
        keys.iter().max(),
        keys.contains(&Key(7)),
        keys.to_vec(),
        keys.clone(),
    );
    let mut heap: std::collections::BinaryHeap<Key> = Counter(30).collect();
    heap.push(Key(1000));
    while heap.pop().is_some() {}
    let mut map: HashMap<Key, u64, BuildHasherDefault<DefaultHasher>> = HashMap::default();
    for k in Counter(60) {
        *map.entry(k).or_insert_with(|| {
            grab();
            0
        }) += 1;
    }
    let _ = (
        map.get(&Key(3)).copied(),
        map.remove(&Key(4)),
        map.contains_key(&Key(5)),
    );
    let set: std::collections::HashSet<Key, BuildHasherDefault<DefaultHasher>> =
        Counter(20).collect();
    let _ = set.iter().filter(|k| map.contains_key(*k)).count();
    let mut tree: BTreeMap<Key, u64> = Counter(50).map(|k| (k, top_a(1))).collect();
    let _ = (
        tree.get(&Key(9)).copied(),
        tree.remove(&Key(10)),
        tree.range(Key(3)..Key(40)).count(),
        tree.insert(Key(77), 1),
    );
    let mut s = String::new();
    for i in 0..12 {
        write!(
            s,
            "{} {:>8} {:?} {}",
            Key(i),
            Key(i),
            Key(i),
            i as f64 / 3.0
        )
        .unwrap();
    }
    let _ = (
        Key(5).to_string(),
        format!("{:?}", vec![Key(1), Key(2)]),
        Order::new(1).n,
        Account::new(2).id,
    );
    let _ = (
        generic_work(1u8),
        generic_work("x"),
        generic_work(vec![1u16]),
        generic_work(tree.len()),
    );
    let mut v: Vec<Key> = Counter(30)
        .chain(Counter(5))
        .zip(Counter(40))
        .map(|(a, b)| Key(a.0 ^ b.0))
        .collect();
    v.retain(|x| {
        grab();
        x.0 != 3
    });
    v.dedup_by(|a, b| {
        grab();
        a.0 == b.0
    });
    v.resize(v.len() + 3, Key(0));
    let folded = v
        .iter()
        .filter(|x| x.0 > 2)
        .map(|x| {
            grab();
            x.0 * 2
        })
        .sum::<u32>();
    let total: u32 = Counter(10)
        .flat_map(|k| Counter(k.0 % 4))
        .map(|k| k.0)
        .sum();
    use std::io::{BufRead, Read, Write};
    let mut lines = String::new();
    let _ = std::io::BufReader::new(Src(20)).read_line(&mut lines);
    let mut all = Vec::new();
    let _ = Src(30).read_to_end(&mut all);
    let _ = std::io::copy(&mut Src(20), &mut Sink);
    let mut w = std::io::BufWriter::with_capacity(16, Sink);
    for k in 0..10 {
        write!(w, "{} ", Key(k)).unwrap();
    }
    w.flush().unwrap();
    std::hint::black_box((s, folded, total, map.len(), lines, all, v, tree));
}

// ---- this binary: load bias, executable ranges, symbol table ----
fn own_module() -> (usize, Vec<(usize, usize)>) {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid `info` for the call, and `data` is the
        // `&mut (usize, Vec)` given to it below, not otherwise borrowed meanwhile.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut (usize, Vec<(usize, usize)>))) };
        out.0 = info.dlpi_addr as usize;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let start = out.0 + ph.p_vaddr as usize;
                out.1.push((start, start + ph.p_memsz as usize));
            }
        }
        1 // the first object is the program itself
    }
    let mut out = (0usize, Vec::new());
    // SAFETY: `cb` reads `data` as the `(usize, Vec)` passed here, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut out as *mut _ as *mut libc::c_void) };
    out
}
/// The addresses, as (kind, offset of the "return address" from the load bias): `S` return
/// addresses of the workload's stacks, `F` a point 4 bytes into (or inside) a function of the
/// symbol table, plus one, so that every symbolizer looks up `offset - 1`.
fn addresses() -> Vec<(char, usize)> {
    workload();
    let (bias, text) = own_module();
    let distinct = STACKS.lock().unwrap();
    let mut set: BTreeMap<usize, char> = BTreeMap::new();
    for st in distinct.iter() {
        for &ip in st {
            if text.iter().any(|&(s, e)| (s..e).contains(&(ip - 1))) {
                set.insert(ip - bias, 'S');
            }
        }
    }
    let data = std::fs::read("/proc/self/exe").unwrap();
    let file = object::File::parse(&*data).unwrap();
    use object::{Object, ObjectSymbol};
    let mut funcs: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0 && s.is_definition())
        .map(|s| (s.address(), s.size()))
        .collect();
    funcs.sort_unstable();
    funcs.dedup_by_key(|f| f.0);
    let step = (funcs.len() / 1000).max(1);
    for &(a, size) in funcs.iter().step_by(step) {
        set.entry((a + size.min(5) - 1 + 1) as usize).or_insert('F');
    }
    eprintln!(
        "stacks captured {}, distinct {}, function symbols {}",
        TICK.load(Relaxed),
        distinct.len(),
        funcs.len()
    );
    set.into_iter().map(|(o, k)| (k, o)).collect()
}

// ---- the three symbolizers: frames innermost first ----
type Frame = (String, Option<String>, Option<u32>);
fn demangle(s: &str) -> String {
    match rustc_demangle::try_demangle(s) {
        Ok(d) => format!("{d:#}"),
        Err(_) => s.to_owned(),
    }
}
fn ours(ips: &[usize]) -> Vec<Vec<Frame>> {
    tracing_prof_core::__private::resolve_uncached(ips)
        .into_iter()
        .map(|fs| {
            fs.into_iter()
                .map(|f| {
                    (
                        f.function.to_string(),
                        f.file.map(|x| x.to_string()),
                        f.line,
                    )
                })
                .collect()
        })
        .collect()
}
fn a2l(l: &addr2line::Loader, ips: &[usize], bias: usize) -> Vec<Vec<Frame>> {
    ips.iter()
        .map(|&ip| {
            let probe = (ip - 1 - bias) as u64;
            let mut out: Vec<Frame> = Vec::new();
            if let Ok(mut it) = l.find_frames(probe) {
                while let Ok(Some(f)) = it.next() {
                    let name = f
                        .function
                        .as_ref()
                        .and_then(|n| n.demangle().ok())
                        .map(|n| n.into_owned());
                    let (file, line) = f
                        .location
                        .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
                    out.push((name.unwrap_or_default(), file, line));
                }
            }
            let sym = || {
                l.find_symbol(probe)
                    .map(demangle)
                    .unwrap_or_else(|| "?".into())
            };
            match out.last_mut() {
                Some(last) if last.0.is_empty() => last.0 = sym(),
                None => {
                    let loc = l.find_location(probe).ok().flatten();
                    out.push((
                        sym(),
                        loc.as_ref().and_then(|l| l.file.map(str::to_owned)),
                        loc.and_then(|l| l.line),
                    ));
                }
                _ => {}
            }
            out
        })
        .collect()
}
fn blaze(s: &blazesym::symbolize::Symbolizer, ips: &[usize]) -> Vec<Vec<Frame>> {
    use blazesym::symbolize::{
        Input, Symbolized,
        source::{Process, Source},
    };
    let src = Source::Process(Process::new(blazesym::Pid::Slf));
    let addrs: Vec<u64> = ips.iter().map(|&ip| (ip - 1) as u64).collect();
    let res = s.symbolize(&src, Input::AbsAddr(&addrs)).unwrap();
    res.into_iter()
        .map(|r| match r {
            Symbolized::Sym(sym) => {
                let ci = |c: &Option<blazesym::symbolize::CodeInfo>| {
                    c.as_ref().map_or((None, None), |c| {
                        (Some(c.to_path().display().to_string()), c.line)
                    })
                };
                let (f, l) = ci(&sym.code_info.map(|b| *b));
                let mut v: Vec<Frame> = vec![(sym.name.into_owned(), f, l)];
                for i in sym.inlined.iter() {
                    let (f, l) = ci(&i.code_info);
                    v.push((i.name.to_string(), f, l));
                }
                v.reverse();
                v
            }
            Symbolized::Unknown(_) => vec![],
        })
        .collect()
}

// ---- measurement ----
fn status(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}
/// User + system CPU time of the process, in ms.
fn cpu_ms() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeroes is a value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into `u`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}
fn measure<T>(label: &str, f: impl FnOnce() -> T) -> T {
    let _ = std::fs::write("/proc/self/clear_refs", "5"); // resets VmHWM to the current RSS
    let (rss0, a0, b0) = (status("VmRSS:"), ALLOCS.load(Relaxed), BYTES.load(Relaxed));
    let (anon0, file0) = (status("RssAnon:"), status("RssFile:"));
    let live0 = LIVE.load(Relaxed);
    PEAK.store(live0, Relaxed);
    let (t, c) = (Instant::now(), cpu_ms());
    let out = f();
    let (ms, cpu) = (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
    let (allocs, bytes) = (ALLOCS.load(Relaxed) - a0, BYTES.load(Relaxed) - b0);
    let heap_peak = PEAK.load(Relaxed) - live0;
    let (hwm, rss) = (status("VmHWM:"), status("VmRSS:"));
    let (anon, file) = (
        status("RssAnon:") as i64 - anon0 as i64,
        status("RssFile:") as i64 - file0 as i64,
    );
    println!(
        "{label}: ms={ms:.2} cpu_ms={cpu:.2} allocs={allocs} bytes={bytes} heap_peak={heap_peak} rss_before_kb={rss0} hwm_added_kb={} rss_added_kb={} anon_added_kb={anon} file_added_kb={file}",
        hwm as i64 - rss0 as i64,
        rss as i64 - rss0 as i64
    );
    out
}
/// One child: resolve the set with `which`, twice, writing the first's frames to `out_path`.
fn run(which: &str, out_path: &str) {
    let addrs = addresses();
    let (bias, _) = own_module();
    let ips: Vec<usize> = addrs.iter().map(|&(_, o)| o + bias).collect();
    let hash = addrs.iter().fold(0xcbf29ce484222325u64, |h, &(_, o)| {
        (h ^ o as u64).wrapping_mul(0x100000001b3)
    });
    println!(
        "which={which} addresses={} (S {}) set_hash={hash:016x}",
        ips.len(),
        addrs.iter().filter(|a| a.0 == 'S').count()
    );
    let (first, second) = match which {
        "ours" => (
            measure("first", || ours(&ips)),
            measure("second", || ours(&ips)),
        ),
        "addr2line" => {
            let (loader, first) = measure("first", || {
                let l = addr2line::Loader::new("/proc/self/exe").unwrap();
                let r = a2l(&l, &ips, bias);
                (l, r)
            });
            (first, measure("second", || a2l(&loader, &ips, bias)))
        }
        "blazesym" => {
            let (s, first) = measure("first", || {
                let s = blazesym::symbolize::Symbolizer::builder()
                    .enable_code_info(true)
                    .enable_inlined_fns(true)
                    .build();
                let r = blaze(&s, &ips);
                (s, r)
            });
            (first, measure("second", || blaze(&s, &ips)))
        }
        _ => panic!("ours|addr2line|blazesym"),
    };
    if first != second {
        println!("WARNING: second resolution differs from the first");
    }
    let mut text = String::new();
    for ((k, o), fs) in addrs.iter().zip(&first) {
        write!(text, "{k}\t{o:x}").unwrap();
        for (n, f, l) in fs {
            write!(
                text,
                "\t{n} @ {}:{}",
                f.as_deref().unwrap_or("?"),
                l.map_or("?".into(), |l| l.to_string())
            )
            .unwrap();
        }
        text.push('\n');
    }
    std::fs::write(out_path, text).unwrap();
}

// ---- comparison ----
type Row = (String, Vec<(String, String)>); // kind, [(name, file:line)]
/// A comparison: what it compares, and the value of a row it compares.
type Check = (&'static str, fn(&Row) -> String);
fn load(path: &str) -> BTreeMap<String, Row> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.split('\t');
            let (k, o) = (it.next().unwrap().to_owned(), it.next().unwrap().to_owned());
            let fs = it
                .map(|f| {
                    let (n, loc) = f.rsplit_once(" @ ").unwrap();
                    let n = demangle(n);
                    let n = match n.rfind("::h") {
                        Some(i) if n.len() - i == 19 => n[..i].to_owned(),
                        _ => n,
                    };
                    (n, loc.replace("/./", "/"))
                })
                .collect();
            (o, (k, fs))
        })
        .collect()
}
/// The name without ours' ` at file:line` suffix (added to tell apart short names).
fn base(n: &str) -> &str {
    n.split(" at ").next().unwrap()
}
/// Has a path outside generic arguments (`a::b`, `<T as U>::f`; not `{closure#0}<a::B>`).
fn qualified(n: &str) -> bool {
    let mut depth = 0i32;
    let bare: String = n
        .chars()
        .filter(|&c| {
            depth += (c == '<') as i32 - (c == '>') as i32;
            depth == 0 && c != '>'
        })
        .collect();
    bare.contains("::")
}
fn compare(paths: &[String]) {
    let outs: Vec<_> = paths.iter().map(|p| load(p)).collect();
    let labels = ["ours", "addr2line", "blazesym"];
    for kind in ["S", "F", "all"] {
        let keys: Vec<&String> = outs[0]
            .keys()
            .filter(|o| kind == "all" || outs[0][*o].0 == kind)
            .collect();
        println!(
            "== kind {kind}: {} addresses (same set in all three: {})",
            keys.len(),
            outs.iter().all(|o| o.len() == outs[0].len())
        );
        let checks: [Check; 5] = [
            ("innermost name (exact)", |r| {
                r.1.first().map_or(String::new(), |f| f.0.clone())
            }),
            ("innermost name (base)", |r| {
                r.1.first().map_or(String::new(), |f| base(&f.0).to_owned())
            }),
            ("frame count", |r| r.1.len().to_string()),
            ("innermost file:line", |r| {
                r.1.first().map_or(String::new(), |f| f.1.clone())
            }),
            ("all frames (base name + file:line)", |r| {
                r.1.iter()
                    .map(|f| format!("{}|{}", base(&f.0), f.1))
                    .collect::<Vec<_>>()
                    .join(";")
            }),
        ];
        for (what, f) in checks {
            let v = |i: usize, o: &String| outs[i].get(o).map(f);
            let n = |a: usize, b: usize| keys.iter().filter(|o| v(a, o) == v(b, o)).count();
            let all = keys
                .iter()
                .filter(|o| v(0, o) == v(1, o) && v(1, o) == v(2, o))
                .count();
            println!(
                "  {what}: all three {all}; ours=a2l {}; ours=blz {}; a2l=blz {}",
                n(0, 1),
                n(0, 2),
                n(1, 2)
            );
        }
    }
    for (i, out) in outs.iter().enumerate() {
        // Per position (inlined frames, outermost frame): how many names are qualified (have
        // `::`); and unqualified names seen with code in more than one file (so several
        // functions under one name; a lower bound).
        let mut files: HashMap<String, BTreeSet<String>> = HashMap::new();
        let mut n = [[0; 2]; 2];
        for (_, fs) in out.values() {
            for (j, (name, loc)) in fs.iter().enumerate() {
                let outer = (j + 1 == fs.len()) as usize;
                n[outer][0] += 1;
                if qualified(name) {
                    n[outer][1] += 1;
                    continue;
                }
                files
                    .entry(name.clone())
                    .or_default()
                    .insert(loc.rsplit_once(':').map_or(loc.clone(), |x| x.0.to_owned()));
            }
        }
        let mut shared: Vec<_> = files
            .iter()
            .filter(|(_, f)| f.len() > 1)
            .map(|(n, f)| format!("{n} ({} files)", f.len()))
            .collect();
        shared.sort();
        println!(
            "{}: inlined frames {} ({} qualified), outermost {} ({} qualified); unqualified names {}, of which in >1 file {}: {:?}",
            labels[i],
            n[0][0],
            n[0][1],
            n[1][0],
            n[1][1],
            files.len(),
            shared.len(),
            &shared[..shared.len().min(12)]
        );
    }
    println!(
        "== disagreements (any frame's base name or file:line, or frame count): first 12 of S, 8 of F"
    );
    let mut shown = [0, 0];
    for (o, (k, _)) in &outs[0] {
        let kind = (k == "F") as usize;
        if shown[kind] == [12, 8][kind] {
            continue;
        }
        let rows: Vec<_> = outs.iter().map(|x| x.get(o).map(|r| &r.1)).collect();
        let key = |r: &Option<&Vec<(String, String)>>| {
            r.map(|v| {
                v.iter()
                    .map(|f| (base(&f.0).to_owned(), f.1.clone()))
                    .collect::<Vec<_>>()
            })
        };
        if key(&rows[0]) == key(&rows[1]) && key(&rows[1]) == key(&rows[2]) {
            continue;
        }
        println!("{k} {o}:");
        for (i, r) in rows.iter().enumerate() {
            let v = r.map_or(vec![], |v| {
                v.iter().map(|f| format!("{} @ {}", f.0, f.1)).collect()
            });
            println!("   {:9} [{}] {}", labels[i], v.len(), v.join("  <=  "));
        }
        shown[kind] += 1;
    }
}
/// Runs `exe child WHICH OUT` and returns its `first:`/`second:` lines' fields.
fn child(exe: &str, which: &str, out: &str) -> Vec<(String, String, f64)> {
    let o = std::process::Command::new(exe)
        .args(["child", which, out])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{which}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut fields = Vec::new();
    for line in text.lines() {
        if line.starts_with("WARNING") {
            println!("{which}: {line}");
        }
        let Some((phase, rest)) = line.split_once(": ") else {
            continue;
        };
        for kv in rest.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=')
                && let Ok(v) = v.parse::<f64>()
            {
                fields.push((phase.to_owned(), k.to_owned(), v));
            }
        }
    }
    fields
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return run(&args[2], &args[3]);
    }
    let exe = std::env::var("TRACING_PROF_SYMBENCH_EXE")
        .unwrap_or_else(|_| std::env::current_exe().unwrap().display().to_string());
    let rounds: usize = std::env::var("TRACING_PROF_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("tracing-prof-symbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let which = ["ours", "addr2line", "blazesym"];
    let out = |w: &str| dir.join(format!("{w}.frames")).display().to_string();
    let mut all: Vec<Vec<(String, String, f64)>> = vec![Vec::new(); 3];
    for _ in 0..rounds {
        for (i, w) in which.iter().enumerate() {
            all[i].extend(child(&exe, w, &out(w)));
        }
    }
    println!("{exe}: medians of {rounds} fresh processes each");
    println!(
        "| | first: ms | cpu ms | allocations | MB allocated | heap peak MB | peak RSS added MiB | later: ms | allocations | MB allocated |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, w) in which.iter().enumerate() {
        let m = |phase: &str, k: &str| {
            median(
                all[i]
                    .iter()
                    .filter(|f| f.0 == phase && f.1 == k)
                    .map(|f| f.2)
                    .collect(),
            )
        };
        println!(
            "| {w} | {:.1} | {:.1} | {:.0} | {:.1} | {:.2} | {:.1} | {:.1} | {:.0} | {:.1} |",
            m("first", "ms"),
            m("first", "cpu_ms"),
            m("first", "allocs"),
            m("first", "bytes") / 1e6,
            m("first", "heap_peak") / 1e6,
            m("first", "hwm_added_kb") / 1024.0,
            m("second", "ms"),
            m("second", "allocs"),
            m("second", "bytes") / 1e6
        );
    }
    compare(&which.map(out));
    let _ = std::fs::remove_dir_all(&dir);
}

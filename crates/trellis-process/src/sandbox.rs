//! The sandbox every command stage and every agent `shell` call runs in.
//!
//! With Debian's `bubblewrap` (`bwrap`) installed and working, a child sees:
//!
//! - the whole file system **read-only**, with `/dev` and `/proc` of its own (a fresh `/proc` in a PID
//!   namespace of its own, so `/proc/$PPID` is the sandbox's init, never Trellis, and no other
//!   process's memory or environment is in reach, as root too);
//! - **writable**: the working directory, a private `/tmp`, the tool caches under the home directory
//!   that builds and test runners write (`~/.cache`, `~/.cargo`, `~/.npm`, `~/.rustup`, `~/.m2`,
//!   `~/.gradle`, `~/.local`), and the paths the workflow or the configuration grant;
//! - **read-only inside the working directory**: the runs directory, so a command cannot rewrite a
//!   run's record;
//! - **hidden**: the user's Trellis configuration (it holds provider keys), an empty directory or file in
//!   its place;
//! - the network, unless the node says `sandbox="network=off"` or the run's file cuts it for every
//!   stage (then only a loopback of its own).
//!
//! The sandbox's init ends every process in it when the command's first process exits, so nothing a
//! stage started (`setsid`, a double fork, `env -i`) outlives it, and it dies with Trellis
//! (`--die-with-parent`).
//!
//! Where `bwrap` is missing or cannot create namespaces here, `auto` falls back to **Landlock**, the
//! kernel's own access control, which the reaper applies before it starts the command: the same
//! read-only system and writable paths (`/tmp` is shared, not private; the runs directory and the
//! configuration file cannot be carved out) and the network cut off for `network=off` (TCP by
//! Landlock, internet sockets by a seccomp filter), but no PID namespace:
//! other processes stay visible, and root's commands can read Trellis's environment (Trellis makes
//! itself non-dumpable, which keeps other users' out). Where neither works, `auto` runs children unconfined and says so; `--sandbox none` (or `[sandbox] mode = "none"` in the configuration) asks for that explicitly, and
//! `--sandbox bubblewrap` refuses to run without it. Unconfined children run under the reaper
//! ([`crate::reaper`]), so nothing they start outlives their stage either way.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What the user asked for (`--sandbox`, the configuration's `sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    /// Bubblewrap when it works here, else none (with a notice).
    #[default]
    Auto,
    /// Bubblewrap, or refuse to run.
    Bubblewrap,
    /// Landlock (the kernel's own access control, applied by the reaper), or refuse to run.
    Landlock,
    /// No confinement.
    None,
}

impl std::str::FromStr for Choice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "auto" => Ok(Self::Auto),
            "bubblewrap" | "bwrap" => Ok(Self::Bubblewrap),
            "landlock" => Ok(Self::Landlock),
            "none" | "off" => Ok(Self::None),
            // Fabro's providers: say what Trellis does instead of guessing which the user meant.
            "local" => Err(
                "Fabro's `local` sandbox runs commands unconfined: that is `none` here \
                 (`auto` confines them to the working directory)"
                    .to_owned(),
            ),
            provider @ ("docker" | "daytona") => Err(format!(
                "Trellis does not start {provider} sandboxes: `auto` confines commands here \
                 (bubblewrap, else Landlock)"
            )),
            other => Err(format!(
                "unknown sandbox `{other}`: use auto, bubblewrap, landlock or none"
            )),
        }
    }
}

/// What one node asks of the sandbox (its `sandbox` attribute, over the graph's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// The network is cut off (a loopback of its own only).
    pub network_off: bool,
    /// More paths the child may write.
    pub writable: Vec<PathBuf>,
}

/// Why the sandbox asked for cannot be had.
#[derive(Debug, thiserror::Error)]
#[error(
    "the bubblewrap sandbox is not available: {reason}; install Debian's `bubblewrap` (apt-get install bubblewrap), or run with --sandbox none to run commands unconfined"
)]
pub struct Unavailable {
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    None {
        asked: bool,
    },
    Bubblewrap {
        bwrap: PathBuf,
    },
    /// Applied by the reaper in the child before the command starts ([`crate::reaper`]).
    Landlock,
}

/// The sandbox of a run: how its children start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    kind: Kind,
    /// How unconfined children are started under the reaper ([`crate::reaper`]).
    reaper: Option<crate::reaper::Launcher>,
    /// Writable for every child besides the working directory (configured, and the home caches).
    writable: Vec<PathBuf>,
    /// Read-only even where they lie under a writable path (the runs directory).
    protected: Vec<PathBuf>,
    /// Replaced by an empty directory (`true`) or file (the user's Trellis configuration).
    hidden: Vec<(PathBuf, bool)>,
    /// Variables every child gets on top of what it inherits (a run file's `[run.sandbox.env]`).
    env: Vec<(String, String)>,
    /// Every child's network is cut, whatever its node says (a run file's Docker
    /// `network_mode = "none"` or Daytona `network = "block"`).
    network_off: bool,
}

/// Tool caches under the home directory that builds and test runners write.
const HOME_CACHES: &[&str] = &[
    ".cache", ".cargo", ".npm", ".rustup", ".m2", ".gradle", ".local",
];

impl Sandbox {
    /// No confinement, because the user said so (`--sandbox none`).
    pub fn none() -> Self {
        Self {
            kind: Kind::None { asked: true },
            reaper: None,
            writable: Vec::new(),
            protected: Vec::new(),
            hidden: Vec::new(),
            env: Vec::new(),
            network_off: false,
        }
    }

    /// The sandbox for `choice` on this machine (probing `bwrap` once per process).
    pub fn choose(choice: Choice) -> Result<Self, Unavailable> {
        let kind = match choice {
            Choice::None => Kind::None { asked: true },
            Choice::Auto => match probe() {
                Ok(bwrap) => Kind::Bubblewrap { bwrap },
                Err(_) if crate::reaper::landlock_supported() => Kind::Landlock,
                Err(_) => Kind::None { asked: false },
            },
            Choice::Bubblewrap => Kind::Bubblewrap { bwrap: probe()? },
            Choice::Landlock if crate::reaper::landlock_supported() => Kind::Landlock,
            Choice::Landlock => {
                return Err(Unavailable {
                    reason: "this kernel does not offer Landlock".to_owned(),
                });
            }
        };
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let writable = home
            .iter()
            .flat_map(|home| HOME_CACHES.iter().map(move |dir| home.join(dir)))
            .collect();
        Ok(Self {
            kind,
            reaper: None,
            writable,
            protected: Vec::new(),
            hidden: Vec::new(),
            env: Vec::new(),
            network_off: false,
        })
    }

    /// Runs unconfined children under the reaper `launcher` starts, so that nothing they start
    /// outlives them.
    #[must_use]
    pub fn with_reaper(mut self, launcher: crate::reaper::Launcher) -> Self {
        self.reaper = Some(launcher);
        self
    }

    /// Whether a child's program starts directly, with nothing in between that would run it (so a
    /// program the kernel will not start is known at once, and can go to the shell instead).
    pub fn starts_directly(&self) -> bool {
        !matches!(self.kind, Kind::Bubblewrap { .. }) && self.reaper.is_none()
    }

    /// A command that runs `program args` in `work_dir` under this sandbox with the node's `policy`,
    /// in a process group of its own: the caller adds the environment and output pipes, and holds the
    /// child with a [`crate::group::ProcessGroup`], which ends it with everything it started. Its
    /// standard input is nothing — or, under the reaper, a pipe the group holds: closing it tells the
    /// reaper the stage is over, so dropping the child must not kill the reaper first.
    pub fn command(
        &self,
        program: &OsStr,
        args: &[&OsStr],
        work_dir: &Path,
        policy: &Policy,
    ) -> tokio::process::Command {
        let (program, args) = self.wrap(program, args, work_dir, policy);
        let mut command = tokio::process::Command::new(program);
        command.args(args).current_dir(work_dir).process_group(0);
        if self.uses_reaper() {
            command
                .stdin(std::process::Stdio::piped())
                .kill_on_drop(false);
        } else {
            command
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
        }
        command
    }

    /// Starts `program args` in `work_dir` under this sandbox with the node's `policy` and its output
    /// piped: as [`Sandbox::command`] does, or — under the reaper — through the spawner
    /// ([`crate::spawner`]), which saves starting the reaper's program. Its environment is this
    /// process's without the secrets the node does not pass on (`pass_env`,
    /// [`crate::secrets::child_env`]), then the sandbox's own variables ([`Sandbox::env`]), then
    /// `extra`: later entries win. Inside the Tokio runtime only (the pipes register with it).
    pub fn start(
        &self,
        program: &OsStr,
        args: &[&OsStr],
        work_dir: &Path,
        policy: &Policy,
        pass_env: &[String],
        extra: &[(&OsStr, &OsStr)],
    ) -> std::io::Result<crate::child::Started> {
        let inherited: Vec<_> = crate::secrets::child_env(pass_env).collect();
        let mut env: Vec<(&OsStr, &OsStr)> = inherited;
        env.extend(self.env().map(|(k, v)| (OsStr::new(k), OsStr::new(v))));
        env.extend(extra.iter().copied());
        let env = env.as_slice();
        if self.uses_reaper()
            && let Some(launcher) = &self.reaper
        {
            let options = self.reaper_options(work_dir, policy);
            if let Some(spawned) =
                crate::spawner::spawn(launcher, &options, program, args, work_dir, env)
            {
                return spawned.map(crate::child::Started::Spawned);
            }
        }
        let mut command = self.command(program, args, work_dir, policy);
        command
            .env_clear()
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // `bwrap --die-with-parent` dies with the thread that starts it: one that lasts (in this
        // runtime, which watches the child).
        let runtime = tokio::runtime::Handle::try_current().ok();
        crate::task::on_lasting_thread(move || {
            let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
            command.spawn()
        })
        .map(crate::child::Started::Child)
    }

    fn uses_reaper(&self) -> bool {
        !matches!(self.kind, Kind::Bubblewrap { .. }) && self.reaper.is_some()
    }

    /// Gives every child these variables on top of what it inherits (the user set them for the run:
    /// a run file's `[run.sandbox.env]`).
    #[must_use]
    pub fn with_env(mut self, env: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(env);
        self
    }

    /// The variables every child gets on top of what it inherits ([`Sandbox::with_env`]); the caller
    /// adds them after the inherited ones, so they win.
    pub fn env(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Cuts every child's network, whatever its node's policy says (the user said so for the run).
    #[must_use]
    pub fn without_network(mut self) -> Self {
        self.network_off = true;
        self
    }

    /// Whether a child with `policy` has its network cut: its node says so, or the run does.
    pub fn cuts_network(&self, policy: &Policy) -> bool {
        self.network_off || policy.network_off
    }

    /// Also lets children write `paths` (the configuration's grants).
    #[must_use]
    pub fn writable(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.writable.extend(paths);
        self
    }

    /// Keeps `paths` read-only even under a writable path (the runs directory).
    #[must_use]
    pub fn protect(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.protected.extend(paths);
        self
    }

    /// Hides `paths` from children (the user's configuration, which holds keys); paths that do not
    /// exist need no hiding.
    #[must_use]
    pub fn hide(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        for path in paths {
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                self.hidden.push((path, meta.is_dir()));
            }
        }
        self
    }

    /// The sandbox's name: `bubblewrap`, `landlock` or `none` (a run's JSON summary).
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Bubblewrap { .. } => "bubblewrap",
            Kind::Landlock if self.reaper.is_some() => "landlock",
            Kind::Landlock | Kind::None { .. } => "none",
        }
    }

    /// Whether a confined child could write `path` wherever it runs: `path` lies under a path the
    /// sandbox lets every child write (the home directory's tool caches, the configured grants).
    /// Never for unconfined children, which may write anything.
    pub fn confined_children_write(&self, path: &Path) -> bool {
        self.name() != "none" && self.writable.iter().any(|dir| path.starts_with(dir))
    }

    /// One line for the start of a run: which sandbox is in force.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Bubblewrap { .. } => "bubblewrap (the system read-only; the working directory, a private /tmp and the home tool caches writable; own PID namespace)".to_owned(),
            Kind::Landlock if self.reaper.is_some() => "landlock (the system read-only; the working directory, /tmp and the home tool caches writable; no PID namespace: bubblewrap is not available here)".to_owned(),
            Kind::Landlock => "none: Landlock needs the trellis executable to apply it".to_owned(),
            Kind::None { asked: true } => {
                "none (--sandbox none): commands and agent tools run unconfined".to_owned()
            }
            Kind::None { asked: false } => "none: neither bubblewrap nor Landlock works here (apt-get install bubblewrap), so commands and agent tools run unconfined".to_owned(),
        }
    }

    /// The program and arguments that run `program args` in `work_dir` under this sandbox with the
    /// node's `policy`. Unconfined, they are `program args` themselves, or the reaper running them.
    fn wrap(
        &self,
        program: &OsStr,
        args: &[&OsStr],
        work_dir: &Path,
        policy: &Policy,
    ) -> (OsString, Vec<OsString>) {
        let Kind::Bubblewrap { bwrap } = &self.kind else {
            let direct = args.iter().map(|a| (*a).to_owned());
            let Some(reaper) = &self.reaper else {
                return (program.to_owned(), direct.collect());
            };
            let mut out: Vec<OsString> = reaper.leading_args().iter().map(OsString::from).collect();
            out.extend(self.reaper_options(work_dir, policy));
            out.push("--".into());
            out.push(program.to_owned());
            out.extend(direct);
            return (reaper.program().as_os_str().to_owned(), out);
        };
        let mut out: Vec<OsString> = Vec::with_capacity(32 + args.len());
        let mut push = |items: &[&OsStr]| out.extend(items.iter().map(|i| (*i).to_owned()));
        push(&[
            "--die-with-parent".as_ref(),
            "--unshare-pid".as_ref(),
            "--ro-bind".as_ref(),
            "/".as_ref(),
            "/".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
        ]);
        if self.cuts_network(policy) {
            push(&["--unshare-net".as_ref()]);
        }
        for path in self.writable_paths(work_dir, policy) {
            // `--bind-try`: a grant that does not exist on this machine is skipped, not an error.
            push(&["--bind-try".as_ref(), path.as_os_str(), path.as_os_str()]);
        }
        for path in &self.protected {
            push(&["--ro-bind-try".as_ref(), path.as_os_str(), path.as_os_str()]);
        }
        for (path, is_dir) in &self.hidden {
            if *is_dir {
                push(&["--tmpfs".as_ref(), path.as_os_str()]);
            } else {
                push(&["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()]);
            }
        }
        push(&[
            "--chdir".as_ref(),
            work_dir.as_os_str(),
            "--".as_ref(),
            program,
        ]);
        out.extend(args.iter().map(|a| (*a).to_owned()));
        (bwrap.clone().into_os_string(), out)
    }
}

impl Sandbox {
    /// The reaper's options for a child in `work_dir` with `policy`: the Landlock confinement, if
    /// that is the sandbox.
    fn reaper_options(&self, work_dir: &Path, policy: &Policy) -> Vec<OsString> {
        let mut out = Vec::new();
        if self.kind == Kind::Landlock {
            out.push(crate::reaper::LANDLOCK_ARG.into());
            for path in self.writable_paths(work_dir, policy) {
                out.extend([OsString::from(crate::reaper::WRITE_ARG), path.into()]);
            }
            if self.cuts_network(policy) {
                out.push(crate::reaper::NETWORK_OFF_ARG.into());
            }
        }
        out
    }

    /// Every path a child may write: the working directory, the configured ones, the node's.
    fn writable_paths<'a>(
        &'a self,
        work_dir: &'a Path,
        policy: &'a Policy,
    ) -> impl Iterator<Item = &'a Path> {
        std::iter::once(work_dir)
            .chain(self.writable.iter().map(PathBuf::as_path))
            .chain(policy.writable.iter().map(PathBuf::as_path))
    }
}

/// Whether `bwrap` is installed and can make the namespaces the sandbox needs here: it runs `true` in
/// the sandbox once per process.
fn probe() -> Result<PathBuf, Unavailable> {
    static PROBED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let bwrap = std::env::var_os("PATH")
                .and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|dir| dir.join("bwrap"))
                        .find(|path| path.is_file())
                })
                .ok_or_else(|| "`bwrap` is not on PATH".to_owned())?;
            let output = std::process::Command::new(&bwrap)
                .args([
                    "--die-with-parent",
                    "--unshare-pid",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                    "--",
                    "true",
                ])
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot start {}: {e}", bwrap.display()))?;
            if output.status.success() {
                Ok(bwrap)
            } else {
                Err(format!(
                    "{} cannot create a sandbox here: {}",
                    bwrap.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        })
        .clone()
        .map_err(|reason| Unavailable { reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("auto".parse::<Choice>(), Ok(Choice::Auto));
        assert_eq!("bwrap".parse::<Choice>(), Ok(Choice::Bubblewrap));
        assert_eq!("none".parse::<Choice>(), Ok(Choice::None));
        // Fabro's providers are named, with what Trellis does instead; no guess is taken.
        let docker = "docker".parse::<Choice>().unwrap_err();
        assert!(
            docker.starts_with("Trellis does not start docker sandboxes"),
            "{docker}"
        );
        let local = "local".parse::<Choice>().unwrap_err();
        assert!(local.contains("that is `none` here"), "{local}");
        assert!(
            "boxed"
                .parse::<Choice>()
                .unwrap_err()
                .starts_with("unknown sandbox `boxed`")
        );
    }

    #[test]
    fn unconfined_children_run_as_given() {
        let (program, args) = Sandbox::none().wrap(
            OsStr::new("sh"),
            &[OsStr::new("-c"), OsStr::new("true")],
            Path::new("/w"),
            &Policy::default(),
        );
        assert_eq!(program, "sh");
        assert_eq!(args, ["-c", "true"]);
        let (program, args) = Sandbox::none()
            .with_reaper(crate::reaper::Launcher::beside(Path::new("/bin/trellis")))
            .wrap(
                OsStr::new("sh"),
                &[OsStr::new("-c"), OsStr::new("true")],
                Path::new("/w"),
                &Policy::default(),
            );
        assert_eq!(program, "/bin/trellis");
        assert_eq!(args, ["__reap", "--", "sh", "-c", "true"]);
    }

    #[test]
    fn bubblewrap_binds_the_work_dir_writable_and_the_runs_dir_read_only_after_it() {
        let sandbox = Sandbox {
            kind: Kind::Bubblewrap {
                bwrap: PathBuf::from("/usr/bin/bwrap"),
            },
            reaper: None,
            writable: vec![PathBuf::from("/home/u/.cache")],
            protected: vec![PathBuf::from("/w/runs")],
            hidden: Vec::new(),
            env: Vec::new(),
            network_off: false,
        };
        // The run's cut applies whatever the node says; without either, the network stays.
        let open = |sandbox: &Sandbox| {
            let (_, args) =
                sandbox.wrap(OsStr::new("true"), &[], Path::new("/w"), &Policy::default());
            !args.iter().any(|a| a == "--unshare-net")
        };
        assert!(open(&sandbox));
        assert!(!open(&sandbox.clone().without_network()));
        let policy = Policy {
            network_off: true,
            writable: vec![PathBuf::from("/data")],
        };
        let (program, args) = sandbox.wrap(
            OsStr::new("sh"),
            &[OsStr::new("-c")],
            Path::new("/w"),
            &policy,
        );
        assert_eq!(program, "/usr/bin/bwrap");
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(line.contains("--unshare-pid"), "{line}");
        assert!(line.contains("--unshare-net"), "{line}");
        assert!(line.contains("--bind-try /w /w --bind-try /home/u/.cache /home/u/.cache --bind-try /data /data --ro-bind-try /w/runs /w/runs"), "{line}");
        assert!(line.ends_with("--chdir /w -- sh -c"), "{line}");
    }
}

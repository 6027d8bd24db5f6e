//! What a program's command line says of itself, generated from its clap tree so that it
//! cannot fall behind: shell completions (`<program> completions bash`) and man pages, one
//! for the program and one for each of its commands (`cyphonic-cloud-token-create(1)`), as
//! the packages install them.

use std::io::Write;
use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// The commands every program has for its own documentation; flattened into its
/// subcommands (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Commands {
    /// Print the completions of this command line for SHELL (bash, zsh, fish, elvish,
    /// powershell); the packages install them.
    Completions {
        /// The shell.
        shell: Shell,
    },
    /// Write the man pages of this command line into DIR, one per command (the packages
    /// install them).
    Manual {
        /// Where.
        #[arg(long)]
        dir: PathBuf,
    },
}

impl Commands {
    /// Does it for the command line `command` (the completions on stdout).
    ///
    /// # Errors
    /// A man page cannot be written.
    pub fn run(self, command: &mut clap::Command) -> std::io::Result<()> {
        match self {
            Self::Completions { shell } => {
                completions(command, shell, &mut std::io::stdout());
                Ok(())
            }
            Self::Manual { dir } => man_pages(command, &dir).map(|_| ()).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("writing the man pages into {}: {e}", dir.display()),
                )
            }),
        }
    }
}

/// Writes the completions of `command` for `shell` to `out`.
pub fn completions(command: &mut clap::Command, shell: Shell, out: &mut dyn Write) {
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, command, name, out);
}

/// Writes the man pages of `command` and of each of its commands, below it, into `dir`
/// (section 1: `<program>.1`, `<program>-<command>.1`); returns their paths.
///
/// # Errors
/// A page cannot be written.
pub fn man_pages(command: &clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut command = command.clone();
    // Each page names its command as it is typed, `cyphonic-cloud token create`.
    command.build();
    let mut written = Vec::new();
    page(&command, command.get_name(), dir, &mut written)?;
    Ok(written)
}

fn page(
    command: &clap::Command,
    title: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    let path = dir.join(format!("{title}.1"));
    let mut roff = Vec::new();
    clap_mangen::Man::new(command.clone())
        .title(title)
        .render(&mut roff)?;
    std::fs::write(&path, roff)?;
    written.push(path);
    // clap's own `help` command needs no page of its own: every page is the help.
    for sub in command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        page(sub, &format!("{title}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> clap::Command {
        clap::Command::new("cyphonic-test")
            .about("Tests.")
            .subcommand(
                clap::Command::new("token").about("Tokens.").subcommand(
                    clap::Command::new("create")
                        .about("Make one.")
                        .arg(clap::Arg::new("expires").long("expires")),
                ),
            )
            .subcommand(clap::Command::new("secret").hide(true))
    }

    /// A page for the program and each command it shows, each naming its options.
    #[test]
    fn every_shown_command_has_its_page() {
        let dir = std::env::temp_dir().join(format!("cyphonic-man-{}", std::process::id()));
        let pages = man_pages(&tool(), &dir).unwrap_or_default();
        let names: Vec<String> = pages
            .iter()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect();
        assert_eq!(
            names,
            [
                "cyphonic-test.1",
                "cyphonic-test-token.1",
                "cyphonic-test-token-create.1"
            ]
        );
        let create =
            std::fs::read_to_string(dir.join("cyphonic-test-token-create.1")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            create.contains(".TH cyphonic-test-token-create 1"),
            "{create}"
        );
        assert!(create.contains("expires"), "{create}");
    }

    #[test]
    fn completions_name_the_commands() {
        let mut out = Vec::new();
        completions(&mut tool(), Shell::Bash, &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("complete -F") && text.contains("cyphonic-test"),
            "{text}"
        );
        assert!(text.contains("create"), "{text}");
    }
}

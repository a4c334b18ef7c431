//! Bounds the memory allocator's arenas before the agent starts its threads.
//!
//! glibc's malloc gives a thread that meets a locked arena a new one, up to eight per core, and
//! keeps what is freed in each arena for reuse. A burst of pod start-ups spread over the runtime's
//! threads so leaves memory resident in many arenas that an idle agent never needs again.
//! A node agent does little allocation at once, so two arenas cost it no measurable contention.

/// Arenas the agent's allocator may use (glibc's default here: 8 per core).
pub(crate) const ARENAS: i32 = 2;

/// What `limit_arenas` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arenas {
    /// Bounded to `ARENAS`.
    Limited,
    /// The user chose with `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES`; left as they set it.
    UserChoice,
    /// Not glibc, or glibc refused; the allocator's default stands.
    Default,
}

/// Bounds glibc's arenas to `ARENAS` unless the environment already chose a bound.
/// Call it before any thread is spawned: a thread that already has an arena keeps it.
pub(crate) fn limit_arenas() -> Arenas {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if user_chose(std::env::var_os("MALLOC_ARENA_MAX").is_some(), &tunables) {
        return Arenas::UserChoice;
    }
    set_arena_max()
}

/// Whether the environment already bounds the arenas.
fn user_chose(malloc_arena_max: bool, glibc_tunables: &str) -> bool {
    malloc_arena_max || glibc_tunables.split(':').any(|t| t.starts_with("glibc.malloc.arena_max="))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // Reason: mallopt is glibc's only in-process way to bound its arenas.
fn set_arena_max() -> Arenas {
    // SAFETY: mallopt takes two integers and changes a malloc parameter under malloc's own lock;
    // it touches no memory of ours, and M_ARENA_MAX is a parameter this glibc knows.
    let done = unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
    if done == 1 { Arenas::Limited } else { Arenas::Default }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max() -> Arenas {
    Arenas::Default
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_the_user_set_is_kept() {
        assert!(user_chose(true, ""));
        assert!(user_chose(false, "glibc.malloc.arena_max=4"));
        assert!(user_chose(false, "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"));
        assert!(!user_chose(false, "glibc.malloc.arena_test=4"));
        assert!(!user_chose(false, ""));
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_bound() {
        // The test harness has threads already; mallopt still accepts the parameter.
        assert_eq!(set_arena_max(), Arenas::Limited);
    }
}

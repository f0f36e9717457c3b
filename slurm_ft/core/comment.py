"""The job's Comment: the one place the launcher (inside the job, as the user) and the monitor (root) both read and
write, so it carries the resume hint, the restart budget's counts and the reason a job stopped.

Every form starts with the tag ``slurm-ft:`` and then ``key=value`` words (values without spaces; the free text of
a stop follows its words). Forms, in the order a job meets them:

====================  =====================================================================  =====================
form                  text                                                                   written by
====================  =====================================================================  =====================
requeue               ``slurm-ft: restart=K resume_step=S cause=C``                           monitor (requeue)
requeue by launcher   ``slurm-ft: restart=K resume_step=S cause=preemption by=launch``        launcher (preemption)
stop                  ``slurm-ft: stopped cause=C by=W <reason>; <evidence>; ...``            launcher, prolog,
                                                                                              monitor (no ``by``)
tempfail              ``slurm-ft: tempfail bad_nodes=a+b attempts=N``                         launcher (gave up on
                                                                                              its nodes)
tempfail, preempted   ``slurm-ft: tempfail cause=preemption resume_step=S attempts=N``        launcher (no requeue)
budget counts         `` in_place=M free=P`` appended to any of the above (0 is left out)      launcher, monitor
====================  =====================================================================  =====================

The rule: ``S`` is a step number or ``none``; ``C`` is a failure category (``slurm_ft.core.taxonomy.Category``);
``W`` is ``launch`` or ``prolog``. A Comment that does not start with the tag is not ours: every reader answers
"nothing" for it, and a writer that must add counts to it starts a new one. Only the words of these forms are
read; a stop's free text is for people. Slurm stores at most a few hundred characters here and ``scontrol`` must
not see a comma, so a stop is folded into one line, commas made semicolons, and cut to ``MAX_COMMENT``.

The same tag starts every drain reason slurm-ft sets on a node (``slurm_ft.cluster.quarantine``): a reason without
it is someone else's and is never overwritten.
"""

from __future__ import annotations

from collections.abc import Iterable

TAG = "slurm-ft:"
MAX_COMMENT = 400
IN_PLACE, FREE = "in_place", "free"  # the restart budget's counts (slurm_ft.core.budget)
BY_LAUNCH = "launch"


def is_ours(comment: str) -> bool:
    return comment.startswith(TAG)


def words(comment: str) -> dict[str, str]:
    """The ``key=value`` words of a slurm-ft Comment; ``{}`` for any other Comment."""
    if not is_ours(comment):
        return {}
    return dict(word.partition("=")[::2] for word in comment[len(TAG):].split() if "=" in word)


# --- writing --------------------------------------------------------------------------------------------------
def requeue(restart: int, resume_step: int | None, cause: str, *, by: str | None = None) -> str:
    """The requeue form: run ``restart`` resumes from ``resume_step`` (``none``) because of ``cause``."""
    step = "none" if resume_step is None else str(resume_step)
    return f"{TAG} restart={restart} resume_step={step} cause={cause}" + (f" by={by}" if by else "")


def stopped(category: str, reason: str, evidence: Iterable[str] = ()) -> str:
    """The stop form, one line of at most ``MAX_COMMENT`` characters (``reason`` may start with ``by=W``)."""
    text = f"{TAG} stopped cause={category} {reason}"
    for item in evidence:
        text += f"; {item}"
    text = " ".join(text.replace(",", ";").split())  # one line; scontrol's Comment= must not hold commas
    return text if len(text) <= MAX_COMMENT else text[: MAX_COMMENT - 3] + "..."


def tempfail(bad_nodes: Iterable[str], attempts: int) -> str:
    """The launcher gave up on its nodes: the monitor requeues the job without ``bad_nodes``."""
    return f"{TAG} tempfail bad_nodes={'+'.join(sorted(bad_nodes))} attempts={attempts}"


def tempfail_preempted(resume_step: int | None, attempts: int) -> str:
    """The launcher was preempted and could not requeue itself."""
    return f"{TAG} tempfail cause=preemption resume_step={resume_step} attempts={attempts}"


def with_counts(comment: str, *, in_place: int, free: int) -> str:
    """``comment`` (a slurm-ft Comment; anything else starts a new one) with the budget's counts set to these."""
    text = comment if is_ours(comment) else TAG
    kept = [w for w in text[len(TAG):].split() if w.partition("=")[0] not in (IN_PLACE, FREE)]
    extra = [f"{name}={value}" for name, value in ((IN_PLACE, in_place), (FREE, free)) if value > 0]
    return " ".join([TAG, *kept, *extra])


# --- reading --------------------------------------------------------------------------------------------------
def counts(comment: str) -> dict[str, int]:
    """``{"in_place": M, "free": P}`` (0 when absent or not a number)."""
    found = words(comment)
    return {name: int(found[name]) if found.get(name, "").isdigit() else 0 for name in (IN_PLACE, FREE)}


def parse_resume_step(comment: str) -> int | None:
    """The ``resume_step=S`` hint of any form, or None."""
    step = words(comment).get("resume_step", "")
    return int(step) if step.isdigit() else None


def parse_restart_cause(comment: str) -> str | None:
    """The ``cause=C`` of a requeue (why the job runs again), or None."""
    if not comment.startswith(f"{TAG} restart="):
        return None
    return words(comment).get("cause") or None


def parse_bad_nodes(comment: str) -> tuple[str, ...]:
    """The nodes a tempfail names (``bad_nodes=n2+n5``)."""
    if not comment.startswith(f"{TAG} tempfail"):
        return ()
    return tuple(n for n in words(comment).get("bad_nodes", "").split("+") if n)


def parse_launcher_stop(comment: str) -> str | None:
    """The launcher's stop (``stopped ... by=launch ...``): the text after the tag, else None."""
    if comment.startswith(f"{TAG} stopped") and words(comment).get("by") == BY_LAUNCH:
        return comment[len(TAG):].strip()[:200]
    return None


def is_launcher_requeue(comment: str, restart_count: int) -> bool:
    """Whether this is the launcher's own preemption requeue for run ``restart_count``."""
    found = words(comment)
    return (found.get("by") == BY_LAUNCH and found.get("cause") == "preemption"
            and found.get("restart") == str(restart_count))

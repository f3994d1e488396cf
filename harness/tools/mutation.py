"""Mutation testing of the modules that decide a verdict: ``python -m harness.tools.mutation [--changed REF]``.

mutmut (docs/mutation.md says why this tool) changes one operator, constant or call of a module at a time
(a *mutant*) and runs the fast tests that reach the changed function: a test that fails has *killed* the
mutant; a mutant that every test passes has *survived*, a change of behaviour no test states.  Each module of
:data:`VERDICT_MODULES` is run against its own subset of fast tests (the ones that state its rules, seconds
each), so the whole set finishes on the 2-core development machine in the time docs/mutation.md gives.

With no option it runs :data:`DEFAULT_MODULES`; ``--all`` every module of the table.  ``--changed REF``: only
the modules of the table that differ from ``REF`` (``git diff REF``: the commits since it and the working tree),
what a contributor runs before a pull request and CI runs on one.  ``--module PATH`` (repeated): those only.

mutmut works in ``.mutation/`` at the checkout's root (ignored by git, made again each run): ``harness`` there
links to the package it copies and mutates into ``.mutation/mutants/``, and every other entry of the checkout is
linked beside that copy, so the code under test finds matrix.yaml, patches/ and results/ where it always does.

Exit status: 0 no survivor that docs/mutation.md does not list as equivalent (each listed with its reason),
1 a survivor it does not list (printed with its diff), 2 bad input (an unknown module, a ref git does not
know, mutmut not installed), 3 mutmut stopped before it judged every mutant.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..common.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASSED

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".mutation"
DOC = ROOT / "docs" / "mutation.md"
#: mutmut's statuses of a mutant the tests caught: killed, or made a test hang (docs/mutation.md).
CAUGHT = ("killed", "timeout")


def _tests(path: str, *names: str) -> tuple[str, ...]:
    """pytest node ids: ``path``'s tests ``names``, or the whole file when none are named."""
    return tuple(f"{path}::{n}" for n in names) or (path,)


#: The modules that decide a verdict -> the fast tests that state their rules (pytest node ids under the
#: checkout).  Subsets, not the fast tier: a test of the committed evidence that reads every run (minutes)
#: would be run again for each mutant that reaches it.
VERDICT_MODULES: dict[str, tuple[str, ...]] = {
    # the slowdown rule of every speed step: the ratio (within-round or of medians), factor, Mann-Whitney U
    "harness/common/statistics.py": _tests(
        "tests/test_speed.py", "test_a_planted_twofold_slowdown_is_a_regression",
        "test_samples_of_one_distribution_pass", "test_a_small_separated_slowdown_is_within_the_factor",
        "test_a_large_slowdown_the_rank_test_does_not_support_is_not_counted",
        "test_a_speedup_rule_needs_the_factor_asked", "test_the_rule_refuses_too_few_samples",
        "test_a_verdict_says_both_medians_the_ratio_against_its_threshold_and_p_against_p_max",
        "test_a_spread_gives_the_median_extremes_and_inclusive_quartiles_of_its_samples",
        "test_two_samples_a_side_are_enough_and_a_ratio_that_is_not_positive_is_refused_saying_so",
        "test_a_verdict_keeps_what_it_was_judged_by_and_words_its_outcome_by_the_rule_asked",
        "test_two_samples_have_their_inclusive_quartiles_and_no_samples_is_refused_in_those_words")
    + _tests("tests/test_one_ratio.py", "test_rounds_that_drift_give_one_ratio_not_the_ratio_of_medians",
             "test_round_ratios_pair_the_rounds_both_sides_have_and_refuse_a_reference_that_is_not_positive"),
    # a comparison's status from the token streams
    "harness/stages/outputs/divergence.py": _tests("tests/test_divergence.py"),
    # triage's speed verdict: within-run ratios, the reference, the factor and the spread
    "harness/triage/speed_ratios.py": _tests(
        "tests/test_speed_ratios.py", "test_per_round_ratios_pair_the_samples_of_one_round",
        "test_the_shipped_matrix_names_upstream_in_the_same_mode",
        "test_the_reference_is_upstream_in_the_same_mode_before_a_rule_s_fork_only_one",
        "test_rule_references_are_per_metric", "test_measurements_of_one_unit_are_the_interleaved_set",
        "test_upstream_in_the_same_mode_is_a_fork_configuration_s_own_key_then_its_first_group_with_a_base_reference",
        "test_a_pair_s_factor_is_the_widest_of_its_groups_rules_per_metric_and_reference",
        "test_a_ratio_needs_a_positive_reference_only_in_the_rounds_both_sides_have",
        "test_measurements_of_another_model_generation_length_or_round_count_are_another_unit",
        "test_a_rule_without_a_reference_names_none", "test_a_reference_with_the_minimum_samples_in_both_runs_is_usable",
        "test_a_ratio_change_is_judged_at_the_p_max_asked",
        "test_a_ratio_change_counts_by_the_speed_rule", "test_a_drift_of_the_machine_is_no_regression_against_upstream",
        "test_a_slowdown_of_the_fork_alone_is_a_regression_against_upstream", "test_against_a_fork_only_reference",
        "test_a_reference_sample_of_zero_gives_no_ratio", "test_a_rule_s_wider_factor_is_the_one_triage_judges_its_pair_by",
        "test_the_shipped_matrix_s_rule_factors",
        "test_without_an_interleaved_reference_a_slowdown_is_suspect_never_a_regression"),
    "harness/triage/speed_spread.py": (*_tests(
        "tests/test_speed_ratios.py", "test_a_pair_restored_from_the_result_cache_is_no_run_of_its_own_in_the_spreads",
        "test_a_cached_pair_leaves_out_only_its_own_rounds_and_the_live_pairs_of_its_model_and_tokens_still_count",
        "test_a_spread_is_the_smallest_change_between_clean_runs_of_one_machine_and_instrument"),
        *_tests("tests/test_speed_spread.py")),
    # the reloads check's rule
    "harness/matrix/loading.py": _tests("tests/test_reloads.py"),
    # the record readers the checks and triage judge from
    "harness/record/loads.py": _tests("tests/test_run_file_readers.py"),
    "harness/record/native_tests.py": _tests("tests/test_run_file_readers.py"),
    # the expectations check's rules: what each configuration must do, by default and declared
    "harness/stages/checks/expectation_rules.py": (
        *_tests("tests/test_expectation_rules.py"), *_tests("tests/test_expectations.py"), *_tests("tests/test_cpu_repack_placement.py"),
        *_tests("tests/test_seed_table.py")),
    # triage's verdict: each change a regression, a fix or neither, what was not compared, the signatures new,
    # known and gone (the functions MUTATED_FUNCTIONS names)
    "harness/triage/triage.py": (
        *_tests("tests/test_triage.py", "test_triage_names_exactly_the_regressions",
                "test_same_failures_with_other_noise_are_known_and_not_regressions",
                "test_fix_is_reported_when_going_back", "test_gone_counts_only_signatures_of_records_the_later_run_has",
                "test_a_run_against_itself_is_clean", "test_blocked_steps_name_the_failed_build",
                "test_a_step_not_run_in_b_is_not_compared_and_a_regression_only_when_strict",
                "test_kl_rising_above_the_threshold_is_a_regression_with_identical_tokens",
                "test_near_tie_and_hard_divergences_are_reported_apart_and_moves_in_tokens",
                "test_a_killed_run_b_is_incomplete_never_clean_even_with_no_regression",
                "test_each_change_is_a_regression_a_fix_or_neither_and_regressions_come_first_then_fixes",
                "test_a_diverged_comparison_s_regression_carries_its_output_mismatch_signature",
                "test_a_step_failing_in_both_runs_with_another_signature_is_a_change_of_neither_kind_naming_both",
                "test_a_step_s_regression_carries_the_later_failure_and_a_fix_the_earlier_one",
                "test_kl_is_judged_per_comparison_and_a_mean_at_the_limit_is_not_above_it",
                "test_moved_model_buffers_are_a_regression_and_a_fix_only_where_the_expectations_went_back_to_passing",
                "test_a_step_s_time_is_reported_only_past_its_noise_between_two_passed_runs_that_did_the_work",
                "test_a_comparison_that_crashed_on_the_reference_side_carries_the_reference_generation_s_signature",
                "test_each_new_signature_names_where_it_was_seen",
                "test_the_report_names_both_runs_their_platforms_and_whether_b_is_a_itself",
                "test_every_failure_of_a_step_that_failed_several_ways_counts_for_new_known_and_gone_signatures",
                "test_a_run_b_another_live_process_holds_is_still_running_first_among_its_incomplete_reasons",
                "test_a_test_of_upstream_s_suite_that_became_regressed_is_a_regression_of_the_triage",
                "test_pinned_bytes_are_judged_per_configuration_over_the_generations_both_runs_have",
                "test_a_comparison_whose_verdict_turned_to_fails_is_a_regression_though_its_status_is_the_same",
                "test_the_report_states_b_s_own_verdict_and_lists_the_regressions_before_what_b_did_not_run"),
        *_tests("tests/test_cache_views.py", "test_triage_sees_cached_results_as_the_fresh_ones_and_names_their_run"),
        *_tests("tests/test_speed.py", "test_triage_counts_a_speed_regression_between_runs_of_one_machine",
                "test_triage_does_not_compare_speed_across_machines",
                "test_triage_judges_each_pair_by_the_rule_factor_it_is_given_over_the_one_its_runs_recorded"),
        *_tests("tests/test_expectations.py", "test_the_step_records_status_log_and_signature"),
        *_tests("tests/test_model_cache_heals.py", "test_a_model_that_could_not_be_made_is_no_regression_of_the_fork")),
    # the statuses of steps, comparisons and runs: which are failures, which leave a run unproven
    "harness/common/statuses.py": (
        *_tests("tests/test_statuses.py"),
        *_tests("tests/test_record.py", "test_a_new_comparison_status_is_one_declaration",
                "test_a_new_unproven_step_status_is_one_declaration_and_makes_the_run_incomplete",
                "test_every_declared_status_says_what_it_means"),
        *_tests("tests/test_verdicts.py", "test_a_comparison_is_judged_against_its_groups_expect",
                "test_a_step_is_judged_by_its_statuss_declared_outcome",
                "test_a_headline_names_the_first_three_failures_then_counts_the_rest")),
}


#: Modules mutated in part -> the functions of theirs that are mutated, as mutmut names them (``x_<function>``,
#: ``xǁ<Class>ǁ<method>``); a module not named here is mutated whole.  triage.py's are the ones that decide a
#: change's category (regression, fix, other, not compared), the run's verdict and the signatures new, known and
#: gone; its text (format_report and its lines), the command line and the confirmation re-run are left out.
MUTATED_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "harness/triage/triage.py": (
        "xǁTriageReportǁto_json", "x__category", "x__unfinished", "x__changes", "x__step_transitions",
        "x__model_unmade", "x__comparison_transitions", "x__kl_transitions", "x__memory_transitions",
        "x__b_recorded", "x__signature_sets", "x__sig_index", "x__pin_changes", "x_time_threshold",
        "x__timing_changes", "x__speed_transitions", "x__order", "x_diff_runs"),
}


def mutant_patterns(modules: Sequence[str]) -> list[str]:
    """The mutants ``mutmut run`` is asked for (fnmatch patterns of mutant names): every mutant of a module
    mutated whole, and those of the functions :data:`MUTATED_FUNCTIONS` names for a module mutated in part."""
    out = []
    for module in modules:
        dotted = module[:-len(".py")].replace("/", ".")
        functions = MUTATED_FUNCTIONS.get(module)
        out += [f"{dotted}.{f}__mutmut_*" for f in functions] if functions else [f"{dotted}.*__mutmut_*"]
    return out


#: The modules ``nox -s mutation`` runs with no module named: one of each kind of verdict (the slowdown rule, the
#: spreads, the reload rule, a record reader), whose run fits in the time docs/mutation.md gives on the 2-core
#: development machine.  The others of :data:`VERDICT_MODULES` run with ``--changed`` when a change touches
#: them, ``--module`` or ``--all``.
DEFAULT_MODULES = ("harness/common/statistics.py", "harness/triage/speed_spread.py",
                   "harness/matrix/loading.py", "harness/record/native_tests.py")


@dataclass(frozen=True)
class Mutant:
    """One mutant mutmut judged: its name (``harness.common.statistics.x_judge__mutmut_3``) and status
    (mutmut's words: killed, survived, timeout, no tests, not checked, ...)."""

    name: str
    status: str


def changed_modules(ref: str, root: Path = ROOT) -> list[str]:
    """The modules of :data:`VERDICT_MODULES` that differ from git ``ref`` in ``root`` (commits since it and the
    working tree), in the table's order.  Raises ValueError naming the ref when git does not know it."""
    done = subprocess.run(["git", "diff", "--name-only", ref, "--"], cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"--changed {ref}: git diff: {done.stderr.strip() or f'exit {done.returncode}'}")
    changed = set(done.stdout.split())
    return [m for m in VERDICT_MODULES if m in changed]


def setup_cfg(modules: Sequence[str]) -> str:
    """mutmut's configuration (its ``setup.cfg`` section) for ``modules`` and their tests, fast tier only."""
    tests = list(dict.fromkeys(t for m in modules for t in VERDICT_MODULES[m]))
    lines = ["[mutmut]", "source_paths = harness", "only_mutate ="]
    lines += [f"    {m}" for m in modules]
    # as paths under the copy mutmut runs pytest in (mutants/, where tests/ is linked): a node id is then
    # tests/<file>::<test>, the name mutmut runs each mutant's tests by; given as absolute paths of the checkout,
    # outside that rootdir, the ids lost their file (``::<test>``), pytest refused them as arguments, and every
    # mutant was counted killed
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    # the fast tier; no cache of failed tests between mutants; mutmut's own -x stops at the first kill; in mutmut's
    # own process, where its hooks see every test (-n 0 overrides the workers pyproject.toml's addopts ask for)
    lines += ["pytest_add_cli_args =", "    -m", "    not slow", "    -p", "    no:cacheprovider", "    -n", "    0"]
    return "\n".join(lines) + "\n"


def prepare(work: Path, modules: Sequence[str], root: Path = ROOT) -> None:
    """A fresh ``work`` directory for mutmut: its configuration, ``harness`` linked to the package, and beside
    the copy it makes (``mutants/``) every other entry of the checkout linked (see the module docstring)."""
    if work.exists():
        shutil.rmtree(work)
    (work / "mutants").mkdir(parents=True)
    (work / "setup.cfg").write_text(setup_cfg(modules), encoding="utf-8")
    (work / "harness").symlink_to(root / "harness", target_is_directory=True)
    for entry in sorted(root.iterdir()):
        if entry.name != "harness" and not entry.name.startswith("."):
            (work / "mutants" / entry.name).symlink_to(entry)


def judged(work: Path, modules: Sequence[str]) -> list[Mutant]:
    """Every mutant of ``modules`` that was asked for (:func:`mutant_patterns`) and its status, as ``mutmut
    results --all true`` run in ``work`` lists them (``    <name>: <status>`` lines), in mutmut's order."""
    done = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work,
                          capture_output=True, text=True)
    patterns = mutant_patterns(modules)
    return [Mutant(name, status) for name, status in parse_results(done.stdout)
            if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def parse_results(text: str) -> list[tuple[str, str]]:
    """(mutant name, status) of each ``    <name>: <status>`` line of ``mutmut results``."""
    return [(m.group(1), m.group(2).strip()) for m in re.finditer(r"^\s+(\S+__mutmut_\d+): (.+)$", text, re.M)]


def listed_equivalent(doc: Path = DOC) -> set[str]:
    """The mutants docs/mutation.md lists as equivalent: every backticked ``…__mutmut_N`` name of its section
    ``## Equivalent mutants`` (up to the next ``## `` heading); a name elsewhere on the page is an example."""
    if not doc.is_file():
        return set()
    section = re.search(r"^## Equivalent mutants\n(.*?)(?=^## |\Z)", doc.read_text(encoding="utf-8"), re.M | re.S)
    return set(re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", section.group(1))) if section else set()


def score(mutants: Sequence[Mutant]) -> tuple[int, int]:
    """(killed, judged): killed counts a timeout (the mutant hung a test) as mutmut does not; judged leaves out
    the mutants no selected test reaches (``no tests``, said apart) and those not checked."""
    counted = [m for m in mutants if m.status not in ("no tests", "not checked")]
    return sum(m.status in CAUGHT for m in counted), len(counted)


def _mutmut(work: Path, *args: str, log: Path | None = None) -> int:
    argv = [sys.executable, "-m", "mutmut", *args]
    if log is None:
        return subprocess.run(argv, cwd=work).returncode
    with open(log, "w", encoding="utf-8") as fh:
        return subprocess.run(argv, cwd=work, stdout=fh, stderr=subprocess.STDOUT).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); returns its exit status."""
    parser = argparse.ArgumentParser(prog="python -m harness.tools.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("--changed", metavar="REF", help="only the verdict modules that differ from git REF")
    parser.add_argument("--module", action="append", default=[], metavar="PATH",
                        help=f"only this module (repeatable); one of: {', '.join(VERDICT_MODULES)}")
    parser.add_argument("--all", action="store_true", help="every verdict module, not only the default set")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants run at once (default: CPUs)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("mutmut") is None:  # not imported: only this tool needs it (NEEDED_MODULES)
        print("error: mutmut is not installed: pip install --require-hashes -r requirements.txt", file=sys.stderr)
        return EXIT_BAD_INPUT
    unknown = [m for m in args.module if m not in VERDICT_MODULES]
    if unknown:
        print(f"error: --module {unknown[0]}: not a verdict module; one of: {', '.join(VERDICT_MODULES)}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    modules = args.module or list(VERDICT_MODULES if args.all or args.changed else DEFAULT_MODULES)
    if args.changed:
        try:
            changed = changed_modules(args.changed)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        modules = [m for m in modules if m in changed]
        if not modules:
            print(f"no verdict module differs from {args.changed}: nothing to mutate")
            return EXIT_PASSED
    print(f"mutating {len(modules)} module(s): {', '.join(modules)}", flush=True)
    prepare(WORK, modules)
    t0 = time.monotonic()
    rc = _mutmut(WORK, "run", "--max-children", str(max(1, args.jobs)), *mutant_patterns(modules),
                 log=WORK / "mutmut.log")
    seconds = time.monotonic() - t0
    mutants = judged(WORK, modules)
    killed, total = score(mutants)
    equivalent = listed_equivalent()
    survivors = [m for m in mutants if m.status not in (*CAUGHT, "no tests")]
    unlisted = [m for m in survivors if m.name not in equivalent]
    unreached = sum(m.status == "no tests" for m in mutants)
    for m in unlisted:
        print(f"\n{m.name}: {m.status}", flush=True)
        _mutmut(WORK, "show", m.name)
    print(f"\n{len(mutants)} mutants of {len(modules)} module(s) in {seconds:.0f} s: {killed} of {total} killed "
          f"({100 * killed / max(total, 1):.1f} %), {unreached} reached by no selected test; "
          f"{len(survivors)} survived, {len(survivors) - len(unlisted)} of them listed as equivalent in "
          f"{DOC.relative_to(ROOT)}, {len(unlisted)} not")
    if rc != 0 or any(m.status == "not checked" for m in mutants):
        print(f"error: mutmut stopped (exit {rc}) before it judged every mutant; its log: {WORK / 'mutmut.log'}",
              file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FAILED if unlisted else EXIT_PASSED


if __name__ == "__main__":
    sys.exit(main())

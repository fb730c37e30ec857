"""The OSA-check badges above the tabs: orthogonality and dense-vs-low-rank error of the current
sizes (:class:`OSACheckView`, :mod:`osa_lab.studies.self_check`)."""

from __future__ import annotations

import html

import panel as pn
import param

from osa_lab.dashboard.caches import CHECKS
from osa_lab.dashboard.figure_view import message_pane
from osa_lab.dashboard.state import Controls, Job, compute_osa_check
from osa_lab.errors import ConfigurationError


class OSACheckView(pn.viewable.Viewer):
    """Badges with the OSA check of the current sizes, one row per OSA preset's head count:
    orthogonality and dense vs low-rank error."""

    controls = param.ClassSelector(class_=Controls)
    result = param.Dict(default=None, allow_None=True, doc="Last good osa_check result (the first OSA preset's).")
    results = param.List(default=[], doc="Last good osa_check results, one per head count, each with its presets.")

    def __init__(self, compute_now: bool = True, **params):
        super().__init__(**params)
        self.job = Job()
        if compute_now:
            self.refresh()

    @param.depends("controls.tokens", "controls.dim", "controls.heads", "controls.derived_alpha", "controls.alpha",
                   "controls.presets", watch=True)
    def refresh(self) -> None:
        """Run the (cached) check for the current sizes (impossible sizes: the page says so once)."""
        c = self.controls
        try:
            c.validate()
            groups = c.check_groups()
        except ConfigurationError:
            return

        def compute():
            return [{**compute_osa_check(*args), "presets": names} for names, args in groups]

        def cached():
            hits = [CHECKS.get(args) for _, args in groups]
            if any(h is None for h in hits):
                return None
            return [{**h, "presets": names} for (names, _), h in zip(groups, hits, strict=True)]

        def apply(value):
            self.param.update(results=value, result=value[0])

        self.job.run(compute, apply, cached)

    @classmethod
    def results_html(cls, results: list[dict]) -> str:
        """The badges of every check, each row naming the OSA presets it covers."""
        rows = []
        for result in results:
            names = result.get("presets") or ()
            label = (f'<span style="font-size:12px;font-weight:600;margin-right:6px">{html.escape(", ".join(names))}:'
                     "</span>" if len(results) > 1 and names else "")  # fmt: skip
            rows.append(f'<div class="osa-check-row">{label}{cls.badges_html(result)}</div>')
        return "".join(rows)

    @staticmethod
    def badges_html(result: dict | None) -> str:
        """HTML badges: ✓ on green within the check's tolerance, ✗ on red outside it (the mark,
        not the colour alone, says which); each badge's tooltip gives the tolerance, and a
        failed check is explained in a line below the badges."""
        if not result:
            return ""
        from osa_lab.studies.self_check import TOLERANCES

        labels = {
            "orthogonality_error": "‖AᵀA − I‖max",
            "dense_vs_lowrank": "dense vs low-rank",
            "lowrank_vs_float64": "low-rank vs float64",
            "norm_preservation": "norm preservation",
        }
        tolerances = next((t for d, t in TOLERANCES.items() if str(d).endswith(str(result["dtype"]))), {})
        parts, failed = [], []
        for key, label in labels.items():
            ok = result["passed"][key]
            colour = "#1a7f37" if ok else "#b42318"
            tol = tolerances.get(key)
            tip = (f"{'within' if ok else 'outside'} the {result['dtype']} tolerance {tol:.0e}" if tol is not None
                   else ("passed" if ok else "failed"))
            if not ok:
                failed.append(f"{label} {result[key]:.1e} > {tol:.0e}" if tol is not None else label)
            parts.append(
                f'<span class="osa-badge" data-check="{key}" data-passed="{str(ok).lower()}" title="{html.escape(tip)}" '
                'style="display:inline-block;margin:2px 6px 2px 0;'
                f'padding:3px 10px;border-radius:12px;background:{colour};color:white;font-size:13px">'
                f"{'✓' if ok else '✗'} {label}: {result[key]:.1e}</span>"
            )
        alpha = result["alpha"]
        meta = (f'<span style="font-size:12px;color:#555">OSA check at N={result["tokens"]}, d={result["dim"]}, '
                f'heads={result["heads"]}, α={alpha:.3g}, {result["dtype"]}, method {result["method"]}</span>')
        note = ""
        if failed:
            note = ('<div class="osa-check-note" style="font-size:12px;color:#b42318;margin-top:2px">✗ outside the '
                    f"tolerance: {html.escape('; '.join(failed))}. The check runs the OSA operator in "
                    f"{html.escape(str(result['dtype']))} at these N, d and α; its rounding error grows with "
                    "‖S‖₂ (α and the size of the tokens), so a large α or N can exceed the tolerance.</div>")
        return "<div>" + "".join(parts) + meta + note + "</div>"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.HTML(pn.bind(self.results_html, self.param.results), sizing_mode="stretch_width",
                         loading=self.job.param.busy, min_height=30),
            message_pane(self.job.param.error),
            sizing_mode="stretch_width",
        )

"""The layout rules of the report figures, checked as the reports save a figure.

A report figure is at least :data:`MIN_FIGURE_PX` pixels wide at :data:`REPORT_DPI`, and its
legends lie beside the axes, never over data or each other (:func:`layout_problems`).
"""

from __future__ import annotations

import holoviews as hv

from osa_lab.plots.depth import with_rendered

__all__ = ["MIN_FIGURE_PX", "REPORT_DPI", "layout_problems"]

#: The narrowest a report figure may be, in pixels at the reports' resolution.
MIN_FIGURE_PX = 600

#: The reports' figure resolution (dots per inch), as :func:`osa_lab.reporting.kernel_setup.show` uses it.
REPORT_DPI = 90


def layout_problems(obj: hv.core.Dimensioned, dpi: int = REPORT_DPI, min_width_px: int = MIN_FIGURE_PX) -> list[str]:
    """What is wrong with the static (matplotlib) layout of a report figure; empty when nothing.

    Checked as the reports save it (tight bounding box at ``dpi``): the figure is at least
    ``min_width_px`` pixels wide; every legend lies outside every panel's axes (so it covers no
    data) and overlaps no other legend.
    """
    def check(fig) -> list[str]:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        problems: list[str] = []
        fig.set_dpi(dpi)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        width_px = fig.get_tightbbox(renderer).width * dpi
        if width_px < min_width_px:
            problems.append(f"figure {width_px:.0f} px wide at {dpi} dpi, narrower than {min_width_px} px")
        axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
        legends = [(ax.get_title() or f"panel {i}", ax.get_legend()) for i, ax in enumerate(fig.axes)]
        legends = [(name, lg) for name, lg in legends if lg is not None and lg.get_visible()]
        legends += [(f"figure legend {i}", lg) for i, lg in enumerate(fig.legends)]
        boxes = [(name, lg.get_window_extent(renderer)) for name, lg in legends]
        for name, box in boxes:
            for ax in axes:
                if box.overlaps(ax.get_window_extent(renderer)):
                    problems.append(f"the legend of {name!r} overlaps the axes of {ax.get_title() or 'a panel'!r}")
        for i, (name, box) in enumerate(boxes):
            for other, other_box in boxes[i + 1:]:
                if box.overlaps(other_box):
                    problems.append(f"the legends of {name!r} and {other!r} overlap")
        return problems

    return with_rendered(obj, check)

"""Figures drawn off screen (matplotlib's Agg canvas, no pyplot state): every PNG the
package writes starts here. matplotlib is imported on the first figure only."""

from __future__ import annotations


def new_figure(figsize):
  """A matplotlib ``Figure`` of ``figsize`` inches on an Agg canvas (``fig.savefig`` works;
  nothing global is touched)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=figsize)
  FigureCanvasAgg(fig)
  return fig


def integer_ticks(ax):
  """Whole-number ticks on both axes of ``ax`` (rounds, clients, classes)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))

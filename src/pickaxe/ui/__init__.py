"""``pickaxe ui``: the local web app (runs, queue, checkpoints, playground, arena). Top floor: nothing imports it.

Every script and style the pages use ships in ``static/`` (uPlot for charts, MIT licence in
``static/vendor/uPlot.LICENSE``); nothing is fetched from a CDN at run time.
"""

DEFAULT_MAX_GENERATIONS = 2
"""Playground generations that run at once by default (``pickaxe ui --max-generations N``): the page's side-by-side
view asks two at a time. A request beyond them is answered 429 at once instead of holding one of the server threads
every page shares."""

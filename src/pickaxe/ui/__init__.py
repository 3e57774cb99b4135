"""``pickaxe ui``: the local web app (runs, queue, checkpoints, playground, arena). Top floor: nothing imports it.

Every script and style the pages use ships in ``static/`` (uPlot for charts, MIT licence in
``static/vendor/uPlot.LICENSE``); nothing is fetched from a CDN at run time.
"""

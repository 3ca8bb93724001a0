"""The execution wing: everything that runs one prepared execution.

`request` (what is run: the request, its prepared form, what `on_started` sees), `hooks` (the
host's hooks into a run, one value), `drive` (the one drive loop for a single-use sandbox and a
session's cell), `evidence` (the rules that turn what was observed into violations, as pure
functions), `assemble` (the result: status precedence, error classification), `broker`
(tool-call policy and dispatch) and `outputs` (the files a script leaves). `sandbox.engine` is
the façade over it. The package re-exports nothing: its modules are imported by name.
"""

__all__: list[str] = []

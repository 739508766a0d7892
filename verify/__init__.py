"""`make verify`: checks that a deployed environment really serves with prefill/decode disaggregation.

Each check is a pure function of what kubectl, the endpoint or the metrics returned, so the same
checks run against a live cluster, against outputs recorded from one, and against the local server.
"""

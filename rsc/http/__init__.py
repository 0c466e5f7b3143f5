"""The HTTP facade (quart-trio on hypercorn).

Parse, authenticate, audit, hand a command to an actor, render the reply; no
business logic lives here (arrives with the service issue).
"""

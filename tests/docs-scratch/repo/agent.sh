#!/bin/sh
# An agent: appends a line to NOTES.md.
echo "a line from the agent" >> NOTES.md

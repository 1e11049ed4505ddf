"""The model every other layer shares: frozen values (values), settings, the expression language
(expr), spaces (space), skeletons (skeleton), operators and problem files (ops, problem).
Imports nothing else of the tool."""

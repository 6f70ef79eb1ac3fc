// Package idemhttp is placeholder.
package idemhttp

package ddbsim

import (
	"math/big"
	"strconv"
	"strings"
)

// DynamoDB's number limits: 38 significant digits, magnitudes from 1E-130
// to 9.99…E+125.
const (
	maxDigits = 38
	minAdjExp = -130
	maxAdjExp = 125
)

// decimal is an exact DynamoDB number: digits × 10^exp, where digits has no
// leading or trailing zeros ("" is zero, with exp 0 and neg false).
type decimal struct {
	neg    bool
	digits string
	exp    int
}

// parseNumber parses a number as DynamoDB accepts it ("-1.50", "1e3",
// "+.5") and checks its limits.
func parseNumber(s string) (decimal, *apiError) {
	bad := validation("A value provided cannot be converted into a number")
	if s == "" {
		return decimal{}, bad
	}
	var d decimal
	i := 0
	if s[0] == '+' || s[0] == '-' {
		d.neg = s[0] == '-'
		i++
	}
	var b strings.Builder
	sawDigit, sawDot := false, false
	frac := 0
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			sawDigit = true
			b.WriteByte(c)
			if sawDot {
				frac++
			}
		case c == '.' && !sawDot:
			sawDot = true
		default:
			goto exponent
		}
	}
exponent:
	if !sawDigit {
		return decimal{}, bad
	}
	exp := 0
	if i < len(s) {
		if s[i] != 'e' && s[i] != 'E' || i+1 >= len(s) {
			return decimal{}, bad
		}
		e, err := strconv.Atoi(s[i+1:])
		if err != nil || e > 1000 || e < -1000 {
			return decimal{}, bad
		}
		exp = e
	}
	digits := strings.TrimLeft(b.String(), "0")
	exp -= frac
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	d.digits = trimmed
	d.exp = exp
	if d.digits == "" {
		return decimal{}, nil
	}
	if len(d.digits) > maxDigits {
		return decimal{}, validation("Attempting to store a number with more than 38 significant digits")
	}
	adj := len(d.digits) - 1 + d.exp
	if adj > maxAdjExp {
		return decimal{}, validation("Number overflow. Attempting to store a number with magnitude larger than supported range")
	}
	if adj < minAdjExp {
		return decimal{}, validation("Number underflow. Attempting to store a number with magnitude smaller than supported range")
	}
	return d, nil
}

// String is the number in plain notation, without trailing zeros: how
// DynamoDB returns numbers.
func (d decimal) String() string {
	if d.digits == "" {
		return "0"
	}
	var b strings.Builder
	if d.neg {
		b.WriteByte('-')
	}
	switch {
	case d.exp >= 0:
		b.WriteString(d.digits)
		b.WriteString(strings.Repeat("0", d.exp))
	case len(d.digits) > -d.exp:
		cut := len(d.digits) + d.exp
		b.WriteString(d.digits[:cut])
		b.WriteByte('.')
		b.WriteString(d.digits[cut:])
	default:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -d.exp-len(d.digits)))
		b.WriteString(d.digits)
	}
	return b.String()
}

// cmpDecimal compares two numbers: -1, 0 or 1.
func cmpDecimal(a, b decimal) int {
	sa, sb := a.sign(), b.sign()
	if sa != sb {
		if sa < sb {
			return -1
		}
		return 1
	}
	if sa == 0 {
		return 0
	}
	m := cmpMagnitude(a, b)
	if sa < 0 {
		return -m
	}
	return m
}

func (d decimal) sign() int {
	switch {
	case d.digits == "":
		return 0
	case d.neg:
		return -1
	}
	return 1
}

// cmpMagnitude compares |a| and |b|, both nonzero.
func cmpMagnitude(a, b decimal) int {
	ea, eb := len(a.digits)+a.exp, len(b.digits)+b.exp
	if ea != eb {
		if ea < eb {
			return -1
		}
		return 1
	}
	// Same position of the leading digit: compare digit strings, the
	// shorter padded with zeros (none has trailing zeros).
	n := max(len(a.digits), len(b.digits))
	for i := range n {
		ca, cb := byte('0'), byte('0')
		if i < len(a.digits) {
			ca = a.digits[i]
		}
		if i < len(b.digits) {
			cb = b.digits[i]
		}
		if ca != cb {
			if ca < cb {
				return -1
			}
			return 1
		}
	}
	return 0
}

// addDecimal returns a+b (sub negates b first), checked against the limits.
func addDecimal(a, b decimal, sub bool) (decimal, *apiError) {
	if sub {
		b.neg = !b.neg
		if b.digits == "" {
			b.neg = false
		}
	}
	e := min(a.exp, b.exp)
	ia, ib := a.bigInt(e), b.bigInt(e)
	sum := new(big.Int).Add(ia, ib)
	s := sum.String()
	if sum.Sign() == 0 {
		return decimal{}, nil
	}
	if e != 0 {
		s += "e" + strconv.Itoa(e)
	}
	return parseNumber(s)
}

// bigInt returns d as an integer in units of 10^e (e <= d.exp).
func (d decimal) bigInt(e int) *big.Int {
	if d.digits == "" {
		return new(big.Int)
	}
	v, _ := new(big.Int).SetString(d.digits+strings.Repeat("0", d.exp-e), 10)
	if d.neg {
		v.Neg(v)
	}
	return v
}

// numberSize is the bytes DynamoDB counts for a number: one per two
// significant digits (leading and trailing zeros trimmed), plus one.
func numberSize(canonical string) int {
	d, _ := parseNumber(canonical)
	return (len(d.digits)+1)/2 + 1
}

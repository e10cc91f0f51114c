package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

// pages holds one template set per page, each the layout plus the page's "content".
type pages struct {
	byName map[string]*template.Template
}

var pageNames = []string{"overview", "runs", "run", "operations", "operation", "totals", "audit", "error"}

var funcs = template.FuncMap{
	"when": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			if t.IsZero() {
				return "–"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if t == nil {
				return "–"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		}
		return fmt.Sprint(t)
	},
	"age": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return time.Since(*t).Round(time.Second).String()
	},
	"until": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		if d := time.Until(*t); d > 0 {
			return "in " + d.Round(time.Second).String()
		}
		return "due; waiting for a worker"
	},
	"count": func(n int) string {
		if n > countCap {
			return strconv.Itoa(countCap) + "+"
		}
		return strconv.Itoa(n)
	},
	"deref": func(p any) string {
		switch p := p.(type) {
		case *string:
			if p != nil {
				return *p
			}
		case *int:
			if p != nil {
				return strconv.Itoa(*p)
			}
		case *int64:
			if p != nil {
				return strconv.FormatInt(*p, 10)
			}
		}
		return ""
	},
	"money": money,
}

// minorDigits are the ISO 4217 currencies whose minor unit is not a hundredth; amounts are
// stored in minor units, so 1000 JPY is 1000, not 10.00.
var minorDigits = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
}

// money renders an amount in minor units with its currency's decimals.
func money(amount int64, currency string) string {
	if currency == "" {
		return strconv.FormatInt(amount, 10)
	}
	digits, ok := minorDigits[currency]
	if !ok {
		digits = 2
	}
	sign := ""
	u := uint64(amount)
	if amount < 0 {
		sign, u = "-", uint64(-amount)
	}
	if digits == 0 {
		return fmt.Sprintf("%s%d %s", sign, u, currency)
	}
	div := uint64(100)
	if digits == 3 {
		div = 1000
	}
	return fmt.Sprintf("%s%d.%0*d %s", sign, u/div, digits, u%div, currency)
}

func parsePages() (*pages, error) {
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing template %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// pageData is what every page's template gets.
type pageData struct {
	Title   string
	Prefix  string
	Viewer  *viewer
	Page    string
	Data    any
	Status  int
	Message string
	Resume  bool
	Resolve bool
	Totals  bool
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, v *viewer, page, title string, data any) {
	h.write(w, r, page, http.StatusOK, &pageData{Title: title, Viewer: v, Page: page, Data: data})
}

func (h *handler) renderError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.write(w, r, "error", status, &pageData{Title: http.StatusText(status), Viewer: &viewer{}, Page: "error", Status: status, Message: msg})
}

func (h *handler) write(w http.ResponseWriter, r *http.Request, page string, status int, d *pageData) {
	d.Prefix = h.cfg.Prefix
	d.Resume, d.Resolve, d.Totals = h.canResume(), h.canResolve(), len(h.cfg.Statements) > 0
	// Render into a buffer first: a template error half-way must not send half a page
	// with a 200.
	var buf bytes.Buffer
	if err := h.pages.byName[page].Execute(&buf, d); err != nil {
		ref := h.errSeq.Add(1)
		h.logger.Error("console: rendering", "ref", ref, "page", page, "error", err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "internal error while rendering (reference %d): the details are in the server's log\n", ref)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}
